-- PromptForge proxies module: the guarded `var` proxy, the frozen `argv` proxy and the
-- sealed `sys` table. Loaded on a section VM's first read of one of them (vm.lua builds them
-- lazily). Receives what it needs from vm.lua (`P`) and reads no globals.
local P = ...
local host, raise, PROXY_DATA, unwrap = P.host, P.raise, P.PROXY_DATA, P.unwrap
local type, tostring, setmetatable = P.type, P.tostring, P.setmetatable
local rawget, rawset = P.rawget, P.rawset
-- Paths name string keys dotted and every other key bracketed, as `to_json` does.
local function path_segment(k)
  if type(k) == 'string' then return '.' .. k end
  return '[' .. tostring(k) .. ']'
end

---------------------------------------------------------------------------------------------
-- var: an empty guarded proxy over plain JSON data; every write stores a validated copy.
---------------------------------------------------------------------------------------------
local var_proxies = setmetatable({}, { __mode = 'k' })

local function var_proxy(data, path)
  local proxy = var_proxies[data]
  if proxy then return proxy end
  proxy = setmetatable({}, {
    __index = function(_, k)
      local v = rawget(data, k)
      if type(v) == 'table' then return var_proxy(v, path .. path_segment(k)) end
      return v
    end,
    __newindex = function(_, k, v)
      if v == nil then
        rawset(data, k, nil)
        return
      end
      local copy, message = host('json_copy', unwrap(v), path .. path_segment(k))
      if message then raise(message) end
      rawset(data, k, copy)
    end,
    __metatable = 'var is guarded',
  })
  var_proxies[data] = proxy
  PROXY_DATA[proxy] = data
  return proxy
end


---------------------------------------------------------------------------------------------
-- argv: writable in the H1 pass, frozen everywhere else.
---------------------------------------------------------------------------------------------
local frozen_proxies = setmetatable({}, { __mode = 'k' })

local function frozen(data)
  if type(data) ~= 'table' then return data end
  local proxy = frozen_proxies[data]
  if proxy then return proxy end
  proxy = setmetatable({}, {
    __index = function(_, k) return frozen(rawget(data, k)) end,
    __newindex = function(_, k)
      local shown
      if type(k) == 'string' then
        shown = "'" .. k .. "'"
      else
        shown = host('debug_notation', k)
      end
      raise('argv is frozen outside H1: cannot set field ' .. shown)
    end,
    __metatable = 'argv is frozen',
  })
  frozen_proxies[data] = proxy
  PROXY_DATA[proxy] = data
  return proxy
end


---------------------------------------------------------------------------------------------
-- sys: sealed, read-only run metadata.
---------------------------------------------------------------------------------------------
-- Fields are looked up in Rust on each read (most sections read few or none).
local sys = setmetatable({}, {
  __index = function(_, k)
    if type(k) ~= 'string' then raise('sys fields must be accessed by string key') end
    local found, v = host('sys', k)
    if not found then raise("runtime error: unknown sys field '" .. k .. "'") end
    return v
  end,
  __newindex = function(_, k)
    raise("sys is read-only; cannot set '" .. tostring(k) .. "'")
  end,
  __metatable = 'sys is sealed',
})

return {
  var = function(data) return var_proxy(data, 'var') end,
  frozen = frozen,
  sys = sys,
}
