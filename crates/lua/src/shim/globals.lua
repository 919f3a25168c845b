-- PromptForge section VM: the globals vm.lua leaves pending until a VM first names one (its
-- LAZY table): the stub tables over the store, models, tools, control and tasks modules, the
-- `var` and `sys` proxies, the user-input Plugin's `input`, and the `_G`-aware
-- getmetatable and setmetatable. Receives what it needs from vm.lua (`P`) and reads no
-- globals: prompt code may have replaced any of them by now.
local P = ...
local module, host, raise = P.module, P.host, P.raise
local error, type, select, next = P.error, P.type, P.select, P.next
local rawget, rawset, rawequal, pcall = P.rawget, P.rawset, P.rawequal, P.pcall
local setmetatable, getmetatable = P.setmetatable, P.getmetatable
local G, GUARD = P.G, P.GUARD

-- A table of stubs: each one loads module `name` on its first call and tail-calls the real
-- function, so the real code loads only in sections that call it.
local function stubs(name, pick, names)
  local t = {}
  for i = 1, #names do
    local f = names[i]
    t[f] = function(...) return pick(module(name))[f](...) end
  end
  return t
end
local function whole(m) return m end

local tools_table
local function tools_stubs()
  if tools_table == nil then
    tools_table = stubs('tools', whole, { 'add', 'always', 'add_local', 'call', 'allow_tasks' })
  end
  return tools_table
end
local control_table
local function control(name)
  if control_table == nil then
    control_table = stubs('control', whole, { 'untrusted', 'call', 'jump', 'fanout' })
  end
  return control_table[name]
end

-- Stock argument errors, raised here because the stock functions are no longer globals
-- (so Lua could not name them in its own message).
local function typename(n, v)
  if n <= 0 then return 'no value' end
  return type(v)
end

local BUILD = {
  store = function()
    return stubs('store', whole, {
      'read', 'read_numbered', 'write', 'append', 'str_replace', 'delete', 'exists', 'glob',
    })
  end,
  models = function()
    return stubs('models', function(m) return m.models end, {
      'use', 'default', 'get', 'infer', 'loop',
    })
  end,
  messages = function() return stubs('models', function(m) return m.messages end, { 'new' }) end,
  compactors = function()
    return stubs('models', function(m) return m.compactors end, { 'fail' })
  end,
  sys = function() return P.proxies().sys end,
  var = function()
    local data = host('var_data')
    local var = P.proxies().var(data)
    P.var_data = data
    P.var = var
    return var
  end,
  tools = tools_stubs,
  -- untrusted, call, jump and fanout: globals, stubs over the `control` module.
  untrusted = function() return control('untrusted') end,
  call = function() return control('call') end,
  jump = function() return control('jump') end,
  fanout = function() return control('fanout') end,
  -- tasks (chapter 15): stubs over the `tasks` module.
  tasks = function()
    return stubs('tasks', whole, {
      'spawn', 'join_any', 'join', 'concurrency', 'ready', 'status', 'pending', 'note', 'cancel',
    })
  end,
  -- promptforge/user-input's prelude: `input`, in a section whose prompt declares it.
  input = function()
    local connected = P.cfg.input_connected
    return {
      ask = function(...)
        if select('#', ...) > 0 then raise('input.ask takes no arguments') end
        local answer = P.suspend('input.ask', {})
        return answer.text, answer.available
      end,
      connected = function() return connected end,
    }
  end,
  getmetatable = function()
    return function(...)
      local t = ...
      if select('#', ...) == 0 then
        error("bad argument #1 to 'getmetatable' (value expected)", 2)
      end
      if rawequal(t, G) then
        local author_mt = P.author_mt()
        if author_mt == nil then return nil end
        local protected = rawget(author_mt, '__metatable')
        if protected ~= nil then return protected end
        return author_mt
      end
      return getmetatable(t)
    end
  end,
  setmetatable = function()
    return function(...)
      local t, mt = ...
      local n = select('#', ...)
      if type(t) ~= 'table' then
        error("bad argument #1 to 'setmetatable' (table expected, got " .. typename(n, t) .. ')', 2)
      end
      if n < 2 or (mt ~= nil and type(mt) ~= 'table') then
        error("bad argument #2 to 'setmetatable' (nil or table expected, got "
          .. typename(n - 1, mt) .. ')', 2)
      end
      if rawequal(t, G) then
        local author_mt = P.author_mt()
        if author_mt ~= nil and rawget(author_mt, '__metatable') ~= nil then
          error('cannot change a protected metatable', 2)
        end
        P.set_author_mt(mt)
        -- Rebuild the guard: the author's other fields apply as they stand now, while
        -- __index and __newindex stay the guard's own and read the author's live.
        for k in next, GUARD do
          if k ~= '__index' and k ~= '__newindex' then GUARD[k] = nil end
        end
        if mt ~= nil then
          for k, v in next, mt do
            if k ~= '__index' and k ~= '__newindex' and k ~= '__metatable' then GUARD[k] = v end
          end
        end
        return t
      end
      -- Finalizers never run: Lua runs `__gc` with hooks off (so no cancel can stop one), and
      -- at teardown. An object is marked for finalization only when its metatable has `__gc`
      -- as it is set, so the field is held back for that moment and put back at once.
      local gc = mt ~= nil and rawget(mt, '__gc') or nil
      if gc ~= nil then
        rawset(mt, '__gc', nil)
        local ok, err = pcall(setmetatable, t, mt)
        rawset(mt, '__gc', gc)
        if not ok then error(err, 2) end
        return t
      end
      return setmetatable(t, mt)
    end
  end,
}

return {
  -- Build pending global `k` (vm.lua stores it in _G).
  global = function(k) return BUILD[k]() end,
  tools_table = tools_stubs,
  -- Step 11: the declared alias globals, set raw so an author __newindex never sees them.
  install_aliases = function()
    local bound = P.cfg.bound_tools
    if #bound > 0 then
      local t = module('tools')
      for i = 1, #bound do P.set_global(bound[i].alias, t.tool_object(bound[i])) end
    end
    for label, handle in next, host('role_globals') do P.set_global(label, handle) end
  end,
}
