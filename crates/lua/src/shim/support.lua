-- PromptForge section VM: the helpers the other shim modules share (`P.suspend`,
-- `P.check_string`, the proxies' data map, ...) and the Engine functions `log`,
-- `list_from_section` and `ui`. vm.lua serves P's missing fields from `fields` and builds
-- the globals through `global` on a VM's first use of them. Receives what it needs from vm.lua
-- (`P`) and reads no globals.
local P = ...
local host, raise, make_error, math_type = P.host, P.raise, P.make_error, P.math_type
local error, type, select, setmetatable = P.error, P.type, P.select, P.setmetatable
local yield, yieldable = P.yield, P.yieldable

local F = {}

-- The type name argument errors use: integer for an integer, number for a float.
local function arg_type(v)
  local t = math_type(v)
  if t == 'integer' then return 'integer' end
  if t == 'float' then return 'number' end
  return type(v)
end
F.arg_type = arg_type

F.check_string = function(name, v)
  if type(v) ~= 'string' then raise(name .. ' must be a string, got ' .. arg_type(v)) end
  if not host('utf8_ok', v) then raise(name .. ' must be a valid UTF-8 string') end
end

-- Suspending calls reach the Engine through this one yield point: `suspend(op, payload)`
-- yields the operation name and a payload table of JSON data; the Engine answers
-- (true, value) or (false, error) where error is {kind, message, fields, run_kind}.
local call_sites = P.cfg.call_sites
F.suspend = function(op, payload, allowed_in_shared_load)
  if P.in_shared and not allowed_in_shared_load then
    -- The shared library's top-level code runs directly, not as a block.
    error('attempt to yield from outside a coroutine', 0)
  end
  if not yieldable() then
    error('attempt to yield from outside a coroutine', 0)
  end
  if call_sites then host('site') end
  local ok, value = yield(op, payload)
  local suspends = P.suspends + 1
  P.suspends = suspends
  if ok then return value end
  local run_kind = value.run_kind
  if run_kind == '' then run_kind = nil end
  local e = make_error(value.kind, value.message, value.fields,
    { run_kind = run_kind, epoch = suspends })
  error(e, 0)
end
-- Run-wide model state (the prompt-wide default, the tools.always list) is read and changed
-- in the run's committed order. While this strand runs ahead of that order the host answers
-- a third value, true; the strand then pauses here (a yield the Engine answers once its order
-- reaches it, not counted as a suspension) and asks again. Where no yield is possible (inside
-- a metamethod called from C), it goes on without waiting.
F.synced = function(op, a, b)
  local x, y, ahead = host(op, a, b)
  if not ahead then return x, y end
  if yieldable() then
    yield('sync', nil)
    return host(op, a, b)
  end
  return host(op, a, b, true)
end
F.in_shared_load = function() return P.in_shared end
F.epoch = function() return P.suspends end
F.control_pending = function() return host('control_pending') end

-- Proxies (var, frozen argv) share one weak map from proxy to the data it stands for.
local PROXY_DATA = setmetatable({}, { __mode = 'k' })
F.PROXY_DATA = PROXY_DATA
F.unwrap = function(v)
  local data = PROXY_DATA[v]
  if data ~= nil then return data end
  return v
end

local BUILD = {
  log = function()
    return function(...)
      local message, quota = host('log', select('#', ...), (...))
      if message then raise(message, quota and { quota = quota } or nil) end
    end
  end,
  list_from_section = function()
    return function(heading)
      local items, message = host('list_from_section', heading)
      if message then raise(message) end
      return items
    end
  end,
  ui = function() return function() return host('ui') end end,
}

return {
  fields = F,
  global = function(k) return BUILD[k]() end,
}
