-- PromptForge section VM: the `store` functions (chapter 09), loaded on first use.
local P = ...
local host, cfg, raise, make_error = P.host, P.cfg, P.raise, P.make_error
local arg_type, check_string, math_type, suspend = P.arg_type, P.check_string, P.math_type, P.suspend
local in_shared_load, epoch = P.in_shared_load, P.epoch
-- Everything comes from P: this chunk runs after prompt code may have replaced globals.
local error, type, tostring, select, setmetatable = P.error, P.type, P.tostring, P.select, P.setmetatable
local string_match = P.string_match

-- store (chapter 09). In a block each call suspends; while the shared library loads it runs
-- directly, and there a number passed where a string is expected is converted to text and any
-- other wrong type fails with a generic conversion message.
local function store_text(fname, index, name, v)
  if in_shared_load() then
    if math_type(v) then v = tostring(v) end
    if type(v) ~= 'string' then
      error("bad argument #" .. index .. " to '" .. fname .. "' (string expected, got "
        .. type(v) .. ")", 3)
    end
  end
  check_string(name, v)
  return v
end

-- Line bounds travel with their Lua types; the Engine checks them. A float that is not finite
-- (no JSON number can carry it) travels as its type alone: the Engine refuses it as the
-- non-integer number it is.
local function bound(v)
  if math_type(v) == 'float' and v - v ~= 0 then return { type = 'number' } end
  return { value = math_type(v) and v or nil, type = arg_type(v) }
end

local function store_call(payload)
  return suspend('store', payload, true)
end

local store = {}
store.read = function(path, first, last)
  path = store_text('read', 1, 'path', path)
  return store_call({ op = 'read', path = path, first = bound(first), last = bound(last) })
end
store.read_numbered = function(path, first, last)
  path = store_text('read_numbered', 1, 'path', path)
  return store_call({ op = 'read_numbered', path = path, first = bound(first), last = bound(last) })
end
store.write = function(path, contents)
  path = store_text('write', 1, 'path', path)
  contents = store_text('write', 2, 'contents', contents)
  return store_call({ op = 'write', path = path, contents = contents })
end
store.append = function(path, contents)
  path = store_text('append', 1, 'path', path)
  contents = store_text('append', 2, 'contents', contents)
  return store_call({ op = 'append', path = path, contents = contents })
end
store.str_replace = function(path, old, new)
  path = store_text('str_replace', 1, 'path', path)
  old = store_text('str_replace', 2, 'old', old)
  new = store_text('str_replace', 3, 'new', new)
  return store_call({ op = 'str_replace', path = path, old = old, new = new })
end
store.delete = function(path)
  path = store_text('delete', 1, 'path', path)
  return store_call({ op = 'delete', path = path })
end
store.exists = function(path)
  path = store_text('exists', 1, 'path', path)
  return store_call({ op = 'exists', path = path })
end
store.glob = function(pattern)
  pattern = store_text('glob', 1, 'pattern', pattern)
  return store_call({ op = 'glob', pattern = pattern }) or {}
end
return store

