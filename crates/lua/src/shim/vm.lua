-- PromptForge section VM setup. Runs once per section VM, before any prompt code.
--
-- Receives `host` (one private Rust function, `host(op, ...)`, that never raises for
-- language-level failures: it returns a value, or nil and a message) and `cfg` (this VM's
-- data and the deterministic-iteration callbacks), installs the sandbox
-- guards and the Engine globals, and returns the private `api` table the Rust side drives.
-- Everything user code can reach is defined here in Lua so that Engine errors are raised as
-- error values (tables with a kind and a message) exactly where the spec says, and so that
-- suspending calls can yield through pcall.
local host, cfg = ...
math.randomseed(cfg.seed)

-- Reference values (tables, functions, coroutines, userdata) print as `table: 0x00000001`,
-- numbered in the order this VM first renders them, never by memory address: a result or a
-- log line that shows one is the same in every run with the same seed. `string.format`'s `%s`
-- renders them the same way. Values with `__tostring` print as they always do. And library
-- calls whose work grows with their input check the cancel flag first. All of it lives in the
-- `text` module (text.lua), loaded on a VM's first call of one of these functions; here each
-- is a stub that tail-calls the real one, and the stock functions are captured before any
-- prompt code can replace them.
-- Every shim module (text.lua, proxies.lua, store.lua, ...) loads through `module(name)`,
-- defined below once its argument `P` exists.
local module
-- What the shim modules share (defined below): their one argument.
local P
-- The stock functions the text module wraps, captured before any prompt code can replace them.
local STOCK = {
  tostring = tostring, format = string.format, gmatch = string.gmatch, gsub = string.gsub,
  find = string.find, match = string.match, upper = string.upper, lower = string.lower,
  reverse = string.reverse, byte = string.byte, rep = string.rep, sort = table.sort,
  move = table.move, pack = table.pack, unpack = table.unpack, pcall = pcall, error = error,
  rawequal = rawequal, type = type, select = select, setmetatable = setmetatable,
  math_type = math.type, maxinteger = math.maxinteger,
}
do
  local text
  local function stub(lib, name)
    lib[name] = function(...)
      local m = text
      if m == nil then
        m = module('text')
        text = m
      end
      return m[name](...)
    end
  end
  stub(_G, 'tostring')
  local STRING = { 'format', 'gmatch', 'find', 'match', 'gsub', 'upper', 'lower', 'reverse',
    'byte', 'rep' }
  for i = 1, #STRING do stub(string, STRING[i]) end
  stub(table, 'sort')
  stub(table, 'move')
end

local G = _G
-- Locals keep the stock names so that stock argument errors name the function as written.
local pcall, xpcall, error = pcall, xpcall, error
local rawget, rawset, rawequal = rawget, rawset, rawequal
local setmetatable, getmetatable = setmetatable, getmetatable
local type, tostring, select, next = type, tostring, select, next
local yield, yieldable = coroutine.yield, coroutine.isyieldable
local table_pack, table_unpack = table.pack, table.unpack

-- Stock functions the lazily loaded modules need, captured before the sandbox removes them.
local stock_concat, stock_rawget = table.concat, rawget
local table_sort = table.sort

-- The sandbox: only string, table, math and the listed base functions stay reachable.
-- (io, os, debug, package, utf8 and require are never loaded.)
G.collectgarbage = nil
G.dofile = nil
G.loadfile = nil
G.load = nil
G.print = nil
G.warn = nil
G.rawequal = nil
G.rawlen = nil
G.rawget = nil
G.rawset = nil
G.coroutine = nil

---------------------------------------------------------------------------------------------
-- Error values
---------------------------------------------------------------------------------------------
local ERR = {}
ERR.__tostring = function(e) return rawget(e, 'message') end
ERR.__concat = function(a, b)
  if getmetatable(a) == ERR then a = rawget(a, 'message') end
  if getmetatable(b) == ERR then b = rawget(b, 'message') end
  return a .. b
end
-- Extra facts about an error value that user code must not see (for example which quota a
-- log error exhausted); weak so error values are collected as usual.
local ERR_EXTRA = setmetatable({}, { __mode = 'k' })

local function make_error(kind, message, fields, extra)
  local e = { kind = kind, message = message }
  if fields then
    for k, v in next, fields do e[k] = v end
  end
  setmetatable(e, ERR)
  if extra then ERR_EXTRA[e] = extra end
  return e
end

local function raise(message, extra)
  error(make_error('lua', message, nil, extra), 0)
end

local math_type, string_match = math.type, string.match

-- Turn any caught error into what pcall hands back: error values and values the author
-- raised come back as they are; a failure inside Rust becomes an error value. (`P.suspends`
-- counts the suspending calls made so far.)

local function normalize(e)
  if type(e) == 'userdata' then
    local kind, message, run_kind = host('normalize', e)
    if kind then
      return make_error(kind, message, nil, { run_kind = run_kind, epoch = P.suspends })
    end
  end
  -- Running out of Lua memory raises Lua's own preallocated message; it is a `lua` error.
  if e == 'not enough memory' then return make_error('lua', e) end
  return e
end

local function finish(ok, ...)
  if not ok then
    local e = ...
    -- A cancel (or a jump) in flight is never caught: it unwinds to the Engine.
    if host('control_pending') then error(e, 0) end
    return false, normalize(e)
  end
  return true, ...
end

G.pcall = function(...)
  if select('#', ...) == 0 then error("bad argument #1 to 'pcall' (value expected)", 0) end
  return finish(pcall(...))
end

-- xpcall is built on first use, by the `errors` module (see LAZY below).
G.xpcall = nil

-- var, the frozen argv and sys are built on first use by the `proxies` module.
local in_h1 = cfg.h1
local function proxies() return module('proxies') end
-- The frozen argv once built.
local frozen_argv

---------------------------------------------------------------------------------------------
-- _G: one guard metatable that serves argv and prose, with the author's metatable behind it.
---------------------------------------------------------------------------------------------
local author_mt = nil
local GUARD = {}
-- The Engine globals still to be built, and the function that builds one (defined below).
local LAZY, materialize

local function read_prose()
  local text, message = host('render_prose')
  if message then raise(message) end
  return text
end

GUARD.__index = function(t, k)
  if LAZY[k] ~= nil then return materialize(k) end
  if k == 'prose' then return read_prose() end
  if k == 'argv' then
    if in_h1 then return nil end
    if frozen_argv == nil then frozen_argv = proxies().frozen(cfg.argv) end
    return frozen_argv
  end
  local mt = author_mt
  if mt == nil then return nil end
  local h = rawget(mt, '__index')
  if h == nil then return nil end
  if type(h) == 'function' then return h(t, k) end
  return h[k]
end

GUARD.__newindex = function(t, k, v)
  if LAZY[k] ~= nil then
    -- A pending Engine global counts as present: it is replaced as a raw field would be.
    LAZY[k] = nil
    rawset(t, k, v)
    return
  end
  if k == 'prose' then
    raise('prose is read-only: assign to `var` or a section global instead')
  end
  if k == 'argv' then
    if in_h1 then
      rawset(t, k, v)
      return
    end
    raise('argv is frozen outside H1: assign it in H1 only')
  end
  local mt = author_mt
  local h = mt and rawget(mt, '__newindex')
  if h == nil then
    rawset(t, k, v)
  elseif type(h) == 'function' then
    h(t, k, v)
  else
    h[k] = v
  end
end

-- getmetatable and setmetatable know about this guard; they are built on first use, by the
-- `globals` module (see LAZY below).
G.getmetatable = nil
G.setmetatable = nil

---------------------------------------------------------------------------------------------
-- Engine globals, installed in the specified order.
---------------------------------------------------------------------------------------------
-- 1. The Engine values.
G.args = cfg.args
if in_h1 then G.argv = cfg.argv end
-- (sys and var are built on first use: see LAZY below.)

-- 2. The Engine functions (log, list_from_section) and 3. ui when the Host supplied a
-- snapshot: built on first use (see LAZY below).

-- 4. item, in a fanout arm's worker section.
if cfg.has_item then G.item = cfg.item end

-- The shim modules' one argument. Its fields are the VM's shared state and the stock
-- functions the modules use (captured here, before prompt code can replace a global); the
-- helpers only modules use (`suspend`, `check_string`, the proxies' data map, ...) come
-- from the `support` module, loaded when a module first asks P for one of them.
P = {
  host = host, cfg = cfg, raise = raise, make_error = make_error, math_type = math_type,
  error = error, type = type, tostring = tostring, select = select,
  setmetatable = setmetatable, string_match = string_match,
  order = cfg.order, table_concat = stock_concat, rawget = stock_rawget,
  next = next, rawset = rawset, pcall = pcall, table_sort = table_sort,
  table_pack = table_pack, table_unpack = table_unpack, yield = yield,
  yieldable = yieldable, handler_depth = 0, stock = STOCK,
  proxies = proxies, G = G, GUARD = GUARD,
  finish = finish, normalize = normalize, xpcall = xpcall, getmetatable = getmetatable,
  rawequal = rawequal,
  author_mt = function() return author_mt end,
  set_author_mt = function(mt) author_mt = mt end,
  -- Suspending calls made so far, and whether the shared library is loading.
  suspends = 0, in_shared = false,
  -- The `var` proxy once built (nil while `var` is pending; read raw).
  var = nil,
  -- Whether this section's model has started tasks, so its rounds gather task notices.
  has_model_tasks = cfg.model_tasks,
}
local loaded = {}
setmetatable(P, { __index = function(t, k)
  local v = module('support').fields[k]
  if v ~= nil then rawset(t, k, v) end
  return v
end })
module = function(name)
  local m = loaded[name]
  if m == nil then
    m = host('load_module', name)(P)
    loaded[name] = m
  end
  return m
end
P.module = module
P.tools_table = function() return module('globals').tools_table() end
-- Deterministic pairs/next and table.concat with __tostring (wrappers from order.rs).
-- The stubs tail-call the real functions, so their errors still point at the caller.
-- Iterating _G first builds the Engine globals still pending (see LAZY below), so the
-- iteration sees every global exactly as if all had been built up front.
local materialize_all
G.pairs = function(...)
  if rawequal((...), G) then materialize_all() end
  return module('order').pairs(...)
end
G.next = function(...)
  if rawequal((...), G) then materialize_all() end
  return module('order').next(...)
end
table.concat = function(...) return module('order').concat(...) end

-- Globals built on a VM's first use of their name, each by the shim module named here: most
-- sections never name `store` or `tasks`, and building every stub table (and loading the
-- code of the rarer base functions) up front was a large part of a section entry. A pending
-- name behaves as if it were present: reading it builds it (before the author's __index is
-- asked), assigning it replaces it without the author's __newindex, and pairs/next over _G
-- build all pending names first. Tables are built in the same shape as ever, so what a
-- section can observe is unchanged.
LAZY = {
  store = 'globals', models = 'globals', messages = 'globals', compactors = 'globals',
  sys = 'globals', var = 'globals', tools = 'globals', tasks = 'globals',
  untrusted = 'globals', call = 'globals', jump = 'globals', fanout = 'globals',
  getmetatable = 'globals', setmetatable = 'globals', xpcall = 'errors',
  log = 'support', list_from_section = 'support',
}
if cfg.has_ui then LAZY.ui = 'support' end
-- 8. The globals of declared Plugins: promptforge/user-input's prelude defines `input`.
if cfg.input_plugin then LAZY.input = 'globals' end
-- Build one pending global.
-- The name stays pending until its value exists: a build that fails (out of memory, inside
-- a pcall) leaves it to be built on the next read instead of losing it.
materialize = function(k)
  local v = module(LAZY[k]).global(k)
  LAZY[k] = nil
  rawset(G, k, v)
  return v
end
materialize_all = function()
  -- Names first, then the builds, so LAZY is not changed while it is traversed. (Global
  -- names iterate bytewise whatever their insertion order, so the build order never shows.)
  local names = {}
  for k in next, LAZY do names[#names + 1] = k end
  for i = 1, #names do materialize(names[i]) end
end
-- Set a global raw from the Engine's side; a pending name of the same key is dropped.
local function set_global(k, v)
  LAZY[k] = nil
  rawset(G, k, v)
end
P.set_global = set_global

setmetatable(G, GUARD)

---------------------------------------------------------------------------------------------
-- The private API the Rust side drives.
---------------------------------------------------------------------------------------------
local api = {}

-- Runs one block as the body of its coroutine; every failure is caught here (with the
-- traceback recorded by the handler) so the coroutine itself always finishes normally.
local function on_error(e) return host('on_error', e) end

api.run_block = function(f)
  return xpcall(f, on_error)
end

-- Replays the shared library: only store calls may suspend while it loads.
api.run_shared = function(f)
  P.in_shared = true
  local results = table_pack(xpcall(f, on_error))
  P.in_shared = false
  return table_unpack(results, 1, results.n)
end

-- What an uncaught error is: its error kind (nil for a value that is not an Engine error
-- value), its message, and the run error kind it carries (nil: decided by the caller).
-- An error value raised again after another suspending call keeps its run error kind only
-- for the kinds the spec lists; a log quota error is `Quota` while it is fresh.
-- A `cancelled` value raised again later is the cancelled outcome (no run error kind at all).
local KEEPS_KIND_LATER = {
  context_exhausted = 'reason', tool_loop_exhausted = true, empty_model_reply = true,
  tool = true, store = 'reason', task_not_owned = 'task', task_consumed = 'task',
}
api.classify = function(e)
  if getmetatable(e) == ERR then
    local extra = ERR_EXTRA[e] or {}
    local kind = rawget(e, 'kind')
    local message = tostring(rawget(e, 'message'))
    if extra.quota then return kind, message, 'Quota' end
    local run_kind = extra.run_kind
    if extra.epoch ~= nil and extra.epoch ~= P.suspends then
      local keep = KEEPS_KIND_LATER[kind]
      if keep == nil or (keep ~= true and rawget(e, keep) == nil) then
        run_kind = nil
      end
    end
    return kind, message, run_kind
  end
  if type(e) == 'userdata' then
    local kind, message, run_kind = host('normalize', e)
    if kind then return kind, message, run_kind end
  end
  return nil, nil, nil
end

-- Step 11: the declared alias globals, set raw so an author __newindex never sees them.
api.install_aliases = function() return module('globals').install_aliases() end

-- Whether `var` still holds its proxy, and the data behind it (nil while `var` is pending:
-- the Engine then has the data the entry started with).
api.var_state = function()
  if LAZY.var ~= nil then return true end
  local var = rawget(P, 'var')
  return var ~= nil and rawequal(rawget(G, 'var'), var), rawget(P, 'var_data')
end
api.argv = function() return rawget(G, 'argv') end
api.frozen_argv_data = cfg.argv
api.globals = G

return api
