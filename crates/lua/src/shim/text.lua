-- PromptForge text module: deterministic `tostring` and `string.format`, and the library
-- calls that check the cancel flag before heavy work. Loaded on a section VM's first call of
-- one of them; until then the VM holds only stubs (vm.lua).
--
-- Wraps the stock functions vm.lua captured when the VM was built (`P.stock`, taken before any
-- prompt code could replace them), and returns the replacements by name. Reads no globals.
local P = ...
local S, host, dispatch = P.stock, P.host, P.order
local tostring, format, type, select = S.tostring, S.format, S.type, S.select
local gmatch, pack, unpack, gsub = S.gmatch, S.pack, S.unpack, S.gsub
local pcall, error, rawequal = S.pcall, S.error, S.rawequal
local REFERENCE = { table = true, ['function'] = true, thread = true, userdata = true }
local ids = S.setmetatable({}, { __mode = 'k' })
local count = 0
local function render(v, name)
  local id = ids[v]
  if id == nil then
    count = count + 1
    id = count
    ids[v] = id
  end
  return format('%s: 0x%08x', name, id)
end
local function deterministic_tostring(...)
  if select('#', ...) == 0 then error("bad argument #1 to 'tostring' (value expected)", 0) end
  local v = ...
  if REFERENCE[type(v)] then
    local name = dispatch(6, v)
    if name ~= nil then return render(v, name) end
  end
  return (tostring(v))
end
-- A stock library call's results, or its error raised again with the function named as a
-- direct call names it (called from this stripped chunk, the stock message says '?').
local function renamed(name, ok, ...)
  if ok then return ... end
  local e = ...
  if type(e) == 'string' then
    e = gsub(e, "^bad argument #(%d+) to '%?'", "bad argument #%1 to '" .. name .. "'")
  end
  error(e, 0)
end
local function stock_format(...)
  return renamed('format', pcall(format, ...))
end
local function deterministic_format(fmt, ...)
  local n = select('#', ...)
  local args
  for i = 1, n do
    local v = select(i, ...)
    if REFERENCE[type(v)] and dispatch(6, v) ~= nil then
      args = args or pack(...)
    end
  end
  if args == nil or type(fmt) ~= 'string' then return stock_format(fmt, ...) end
  -- Only `%s` conversions render their argument as text; every other one keeps the value,
  -- so its own error message is unchanged.
  local i = 0
  for flags, conversion in gmatch(fmt, '%%([-+ #0]*%d*%.?%d*)(.)') do
    if conversion ~= '%' or flags ~= '' then
      i = i + 1
      local v = args[i]
      if conversion == 's' and REFERENCE[type(v)] then
        local name = dispatch(6, v)
        if name ~= nil then args[i] = render(v, name) end
      end
    end
  end
  return stock_format(fmt, unpack(args, 1, n))
end
local M = { tostring = deterministic_tostring, format = deterministic_format }

-- Library calls whose work grows with their input run as one C call, where the cancel hook
-- (which counts VM instructions) cannot reach. Each checks the cancel flag before it starts
-- when its input is large, so a loop of heavy calls ends within one call of a cancel; and
-- `table.move` over a large range runs in slices with a check between them.
local function cancelled() return host('control_pending') end
local BIG = 4096
local function guard(name, big)
  local stock = S[name]
  M[name] = function(...)
    if big(...) and cancelled() then error('run cancelled', 0) end
    return renamed(name, pcall(stock, ...))
  end
end
local function big_string(s) return type(s) == 'string' and #s > BIG end
local function big_rep(s, n)
  return type(s) == 'string' and type(n) == 'number' and #s * n > BIG * 16
end
local GUARDED_STRINGS = { 'find', 'match', 'gsub', 'upper', 'lower', 'reverse', 'byte' }
for i = 1, #GUARDED_STRINGS do guard(GUARDED_STRINGS[i], big_string) end
guard('rep', big_rep)
guard('sort', function(t) return type(t) == 'table' and #t > BIG end)
M.gmatch = function(...)
  local iterate = renamed('gmatch', pcall(gmatch, ...))
  local s = ...
  if not big_string(s) then return iterate end
  return function()
    if cancelled() then error('run cancelled', 0) end
    return iterate()
  end
end
local stock_move, math_type, maxinteger = S.move, S.math_type, S.maxinteger
local SLICE = 1 << 16
M.move = function(...)
  local a1, f, e, t, a2 = ...
  if math_type(f) ~= 'integer' or math_type(e) ~= 'integer' or math_type(t) ~= 'integer'
    or e < f or e - f < SLICE or type(a1) ~= 'table' then
    return renamed('move', pcall(stock_move, ...))
  end
  -- Stock Lua's own checks, with its messages, before any element moves.
  if not (f > 0 or e < maxinteger + f) then
    error("bad argument #3 to 'move' (too many elements to move)", 0)
  end
  local n = e - f + 1
  if not (t <= maxinteger - n + 1) then
    error("bad argument #4 to 'move' (destination wrap around)", 0)
  end
  if select('#', ...) >= 5 and a2 ~= nil and type(a2) ~= 'table' then
    return renamed('move', pcall(stock_move, ...))
  end
  local dest = a2
  if dest == nil then dest = a1 end
  -- Overlapping ranges of one table move back to front, as stock Lua does.
  local backward = t > f and t <= e and rawequal(a1, dest)
  local done = 0
  while done < n do
    if cancelled() then error('run cancelled', 0) end
    local count = n - done
    if count > SLICE then count = SLICE end
    if backward then
      local last = n - done
      stock_move(a1, f + last - count, f + last - 1, t + last - count, dest)
    else
      stock_move(a1, f + done, f + done + count - 1, t + done, dest)
    end
    done = done + count
  end
  return dest
end

return M
