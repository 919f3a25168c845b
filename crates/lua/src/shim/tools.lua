-- PromptForge section VM: the `tools` functions (chapter 12), loaded on first use.
local P = ...
local host, cfg, raise, make_error = P.host, P.cfg, P.raise, P.make_error
local arg_type, suspend, epoch = P.arg_type, P.suspend, P.epoch
-- Everything comes from P: this chunk runs after prompt code may have replaced globals.
local error, type, tostring, select, setmetatable = P.error, P.type, P.tostring, P.select, P.setmetatable
local next, rawget, rawset, pcall = P.next, P.rawget, P.rawset, P.pcall
local table_concat, table_sort, table_pack, table_unpack =
  P.table_concat, P.table_sort, P.table_pack, P.table_unpack

local ENGINE_TOOLS = { task = true, task_cancel = true, task_status = true, await_tasks = true }
local string_match = P.string_match
local PARAM_TYPES = { string = true, integer = true, number = true, boolean = true }

-- Bound tool slots, in declaration order.
local bound, bound_order = {}, {}
for i = 1, #cfg.bound_tools do
  local b = cfg.bound_tools[i]
  bound[b.alias] = b
  bound_order[#bound_order + 1] = b.alias
end

-- Tool objects: frozen proxies with five fields.
local TOOL_OF = setmetatable({}, { __mode = 'k' })
local function tool_object(b)
  local fields = {
    name = b.alias, description = b.description, wire_name = b.wire_name, untrusted = false,
  }
  local proxy = setmetatable({}, {
    __index = function(_, k)
      if k == 'parameters' then return {} end
      return fields[k]
    end,
    __newindex = function(_, k)
      raise('Tool objects are frozen: cannot assign field "' .. tostring(k) .. '"')
    end,
    __metatable = 'Tool objects are frozen',
  })
  TOOL_OF[proxy] = b.alias
  return proxy
end

local function typed_error(kind, message, fields, run_kind)
  error(make_error(kind, message, fields, { run_kind = run_kind, epoch = epoch() }), 0)
end

local function check_alias(alias)
  if not host('valid_name', alias) then
    raise('invalid alias "' .. tostring(alias) .. '": expected [A-Za-z][A-Za-z0-9_-]{0,63}')
  end
end

local function list(names)
  return '[' .. table_concat(names, ', ') .. ']'
end

-- An alias list as the spec's `{aliases:?}` prints it: each alias in double quotes (aliases
-- follow the alias grammar, so none needs escaping).
local function quoted(names)
  local parts = {}
  for i = 1, #names do parts[i] = '"' .. names[i] .. '"' end
  return list(parts)
end

-- The section's own scope: aliases it added (in order), its description overrides, its
-- local tools (in registration order), and the task built-ins' allowlist (`tools.allow_tasks`:
-- nil until it runs, true for any section, else the list of headings).
local added, added_set, overrides = {}, {}, {}
local allowed = nil
local locals, local_by_alias = {}, {}
local handler_depth = 0

-- The bound scope: the run-wide tools.always aliases, then this section's additions.
-- What changes the section's own scope (`tools.add`, `tools.add_local`, `tools.allow_tasks`)
-- moves `version` on; the run-wide `tools.always` list is the one last read while the host
-- reports it unchanged. The scope and a round's specs are rebuilt only when either moved.
local version = 0
local always_list, always_version = nil, nil
local scope_memo, tools_memo = nil, nil
local function always_now()
  local list, v = P.synced('tools_always_list', always_version)
  if list ~= nil or always_list == nil then always_list, always_version = list or {}, v end
  return always_list
end

local function bound_scope()
  local always = always_now()
  local memo = scope_memo
  if memo ~= nil and memo.always == always and memo.version == version then
    return memo.scope, always
  end
  local scope, seen = {}, {}
  for i = 1, #always do
    local alias = always[i].alias
    if not seen[alias] then seen[alias] = true; scope[#scope + 1] = alias end
  end
  for i = 1, #added do
    local alias = added[i]
    if not seen[alias] then seen[alias] = true; scope[#scope + 1] = alias end
  end
  scope_memo = { always = always, version = version, scope = scope }
  return scope, always
end

-- The task built-ins, in their fixed order; `task` names the targets it accepts.
local ID_SCHEMA = {
  type = 'object',
  properties = {
    id = { type = 'string', description = 'The task id, exactly as `task` returned it, such as `0.0`.' },
  },
  required = { 'id' },
}
local function task_tool_specs()
  local targets
  if allowed == true then
    targets = '`target` must be any section of this prompt, named by its heading (for example `## Research`).'
  else
    targets = '`target` must be one of: ' .. table_concat(allowed, ', ')
  end
  return {
    {
      name = 'task',
      description = 'Start a background task that runs one section of this prompt beside you; it '
        .. 'returns its task id at once, and the result reaches you later as a task notice. '
        .. targets,
      parameters = {
        type = 'object',
        properties = {
          target = { type = 'string', description = 'The heading of the section to run, such as `## Research`.' },
          input = { type = 'string', description = "Optional: replaces the task's argument string." },
        },
        required = { 'target' },
      },
    },
    {
      name = 'task_cancel',
      description = 'Cancel one of the tasks you started.',
      parameters = ID_SCHEMA,
    },
    {
      name = 'task_status',
      description = 'Read one line of status about one of the tasks you started.',
      parameters = ID_SCHEMA,
    },
    {
      name = 'await_tasks',
      description = 'Wait until one of the tasks you started ends, then read every task notice '
        .. 'that has arrived, one per line.',
      parameters = {
        type = 'object',
        properties = {
          timeout = { type = 'number', description = 'Optional: stop waiting after this many seconds (fractions allowed).' },
        },
      },
    },
  }
end

-- What a model round offers: the bound scope, the local tools, then the task built-ins.
local function round_tools()
  local scope, always = bound_scope()
  local memo = tools_memo
  if memo ~= nil and memo.scope == scope and memo.version == version then
    return memo.specs, memo.names
  end
  local always_desc = {}
  for i = 1, #always do always_desc[always[i].alias] = always[i].description end
  local specs, names = {}, {}
  for i = 1, #scope do
    local alias = scope[i]
    local b = bound[alias]
    specs[#specs + 1] = {
      name = alias,
      description = overrides[alias] or always_desc[alias] or b.description,
      parameters = b.parameters,
    }
    names[#names + 1] = alias
  end
  for i = 1, #locals do
    local l = locals[i]
    specs[#specs + 1] = { name = l.alias, description = l.description, parameters = l.schema }
    names[#names + 1] = l.alias
  end
  if allowed ~= nil then
    local task_specs = task_tool_specs()
    for i = 1, #task_specs do
      specs[#specs + 1] = task_specs[i]
      names[#names + 1] = task_specs[i].name
    end
  end
  tools_memo = { scope = scope, version = version, specs = specs, names = names }
  return specs, names
end

-- tools.calls: appears at the section's first tool call; a live, read-only view.
local counts, counted = nil, {}
local function seeded_list()
  local names = {}
  for i = 1, #counted do names[i] = counted[i] end
  return list(names)
end
local function calls_view()
  return setmetatable({}, {
    __index = function(_, k)
      local n = counts[k]
      if n ~= nil then return n end
      local message = 'tools.calls: "' .. tostring(k) .. '" has no seeded count; seeded aliases: '
        .. seeded_list()
      if bound[k] then
        message = message .. ' (alias is a bound tool slot but was neither added to this '
          .. "section's scope nor dispatched by tools.call)"
      elseif #counted > 0 then
        message = message .. ' - check for typos or add it via tools.add'
      end
      raise(message)
    end,
    __newindex = function() raise('tools.calls is read-only') end,
    __metatable = 'tools.calls is read-only',
  })
end
local function seed(alias)
  if counts[alias] == nil then
    counts[alias] = 0
    counted[#counted + 1] = alias
  end
end
-- Every call attempt counts, before the tool runs.
local function count_call(alias)
  if counts == nil then
    counts = {}
    rawset(P.tools_table(), 'calls', calls_view())
    P.synced('first_tool_call')
  end
  local scope = bound_scope()
  for i = 1, #scope do seed(scope[i]) end
  seed(alias)
  counts[alias] = counts[alias] + 1
end

-- Run a local tool's handler with a fresh table of the call's arguments; its first return
-- value is the result text (the scalar rule; nil gives '').
local function run_handler(l, args)
  local fresh = host('json_copy', args, 'args') or {}
  handler_depth = handler_depth + 1
  P.handler_depth = handler_depth
  local results = table_pack(pcall(l.handler, fresh))
  handler_depth = handler_depth - 1
  P.handler_depth = handler_depth
  -- The result's text by the scalar rule, and the call reported to the event stream (a
  -- cancel or jump in flight reports nothing).
  local text, message = host('handler_done', l.alias, results[1], results[2])
  if not results[1] then error(results[2], 0) end
  if message then raise(message) end
  return text
end

-- A bound tool's call: Harness work. Its own failure is a `tool` error value; an untrusted
-- tool's output comes back in the untrusted envelope.
local function call_bound(alias, args)
  local b = bound[alias]
  local result = suspend('tool.call', { alias = alias, path = b.path, args = args })
  if b.untrusted then return host('untrusted', result) end
  return result
end

-- The tool's own failure text inside a `tool` error value's message.
local function failure_text(err)
  local message = tostring(err)
  if type(err) == 'table' and err.kind == 'tool' then
    local text = string_match(message, '^tool call failure: (.*)$')
    if text then return text end
  end
  return message
end

local M = {}
M.round_tools = round_tools
M.tool_object = tool_object

-- Answer one model tool call inside models.loop: the text for its tool record. A bound
-- tool's failure becomes untrusted failure text; a handler's error ends the loop.
M.answer_call = function(name, args)
  -- A task built-in always reaches the Engine, before any alias is looked up.
  if ENGINE_TOOLS[name] and allowed ~= nil then
    local text = P.module('tasks').model_tool(name, args, allowed)
    host('tool_report', name, 'task', true)
    return text
  end
  count_call(name)
  local l = local_by_alias[name]
  if l then return run_handler(l, args) end
  local ok, result = pcall(call_bound, name, args)
  if ok then return result end
  if P.control_pending() then error(result, 0) end
  return host('untrusted', failure_text(result))
end

-- The out_of_scope_tool failure for a name the round did not offer.
M.out_of_scope = function(name, names)
  local message = 'tool "' .. tostring(name) .. '" is not in this section\'s scope; in-scope aliases: '
    .. quoted(names)
  if bound[name] then
    message = message .. " (alias is a bound tool slot but was not added to this section's scope)"
  end
  typed_error('out_of_scope_tool', message, { name = name }, 'Tool')
end

M.always = function(alias, description)
  check_alias(alias)
  if not bound[alias] then raise('tools.always alias "' .. alias .. '" is not a bound tool slot') end
  if description ~= nil and type(description) ~= 'string' then
    raise('tools.always override must be a string, got ' .. arg_type(description))
  end
  P.synced('tools_always', alias, description)
end

M.add = function(...)
  local n = select('#', ...)
  if n == 0 then return end
  local a, description, extra = ...
  if n >= 3 then
    raise('tools.add takes one alias plus an optional override, got extra ' .. arg_type(extra))
  end
  local entries
  if type(a) == 'table' and TOOL_OF[a] == nil then
    if description ~= nil then raise('tools.add array form takes no override') end
    entries = {}
    -- Up to the first nil: a hostile `__len` cannot make this loop run for ever.
    for i = 1, #a do
      local e = a[i]
      if e == nil then break end
      entries[i] = e
    end
  else
    entries = { a }
    if description ~= nil and type(description) ~= 'string' then
      raise('tools.add override must be a string, got ' .. arg_type(description))
    end
  end
  -- All or nothing: every entry is checked before any is recorded.
  local aliases = {}
  for i = 1, #entries do
    local e = entries[i]
    local alias = TOOL_OF[e] or e
    if type(alias) ~= 'string' then
      raise('tools.add expects strings, Tool objects, or arrays of either, got ' .. arg_type(e))
    end
    check_alias(alias)
    if not bound[alias] then raise('tools.add alias "' .. alias .. '" is not a bound tool slot') end
    aliases[i] = alias
  end
  for i = 1, #aliases do
    local alias = aliases[i]
    if not added_set[alias] then
      added_set[alias] = true
      added[#added + 1] = alias
    end
  end
  if description ~= nil and #aliases == 1 then overrides[aliases[1]] = description end
  version = version + 1
end

M.add_local = function(alias, description, params, handler)
  check_alias(alias)
  if bound[alias] then
    raise('tools.add_local alias "' .. alias .. '" duplicates a bound tool slot')
  end
  if local_by_alias[alias] then
    raise('tools.add_local alias "' .. alias .. '" is already registered')
  end
  if type(description) ~= 'string' then
    raise('tools.add_local description must be a string, got ' .. arg_type(description))
  end
  if type(params) ~= 'table' then
    raise('tools.add_local params must be a table, got ' .. arg_type(params))
  end
  if type(handler) ~= 'function' then
    raise('tools.add_local handler must be a function, got ' .. arg_type(handler))
  end
  -- The schema lists names bytewise-sorted, so it is the same text on every run.
  local names = {}
  for name in next, params do
    if type(name) ~= 'string' then
      raise('tools.add_local param names must be strings, got ' .. arg_type(name))
    end
    names[#names + 1] = name
  end
  table_sort(names)
  local properties = {}
  for i = 1, #names do
    local name = names[i]
    local spec = rawget(params, name)
    local ptype, pdesc
    if type(spec) == 'string' then
      ptype = spec
    elseif type(spec) == 'table' then
      ptype, pdesc = rawget(spec, 1), rawget(spec, 2)
    else
      raise('tools.add_local param "' .. name
        .. '" must be a type string or a {type, description} array')
    end
    if not PARAM_TYPES[ptype] then
      raise('tools.add_local param "' .. name .. '" has unsupported type "' .. tostring(ptype)
        .. '": expected "string", "integer", "number", or "boolean"')
    end
    properties[name] = { type = ptype, description = pdesc }
  end
  local schema = { type = 'object', properties = properties }
  if #names > 0 then schema.required = names end
  local l = { alias = alias, description = description, schema = schema, handler = handler }
  locals[#locals + 1] = l
  local_by_alias[alias] = l
  version = version + 1
end

-- tools.allow_tasks(targets?): the task built-ins join every later round of the section.
M.allow_tasks = function(targets)
  if targets == nil then
    allowed = true
    version = version + 1
    return
  end
  if type(targets) ~= 'table' then
    raise('tools.allow_tasks targets must be a list of section headings, got ' .. arg_type(targets))
  end
  local list, i = {}, 1
  while true do
    local v = targets[i]
    if v == nil then break end
    if type(v) ~= 'string' then
      raise('tools.allow_tasks targets must be section heading strings, got ' .. arg_type(v))
    end
    local heading = string_match(v, '^%s*(.-)%s*$')
    if heading == '' then raise('tools.allow_tasks targets must be non-empty section headings') end
    list[i] = heading
    i = i + 1
  end
  if i == 1 then
    raise('tools.allow_tasks targets must name at least one section; call it with no argument '
      .. 'to allow any section')
  end
  allowed = list
  version = version + 1
end

M.call = function(alias, args)
  local name = TOOL_OF[alias] or alias
  if type(name) ~= 'string' then
    raise('tools.call alias must be a string or Tool object, got ' .. arg_type(alias))
  end
  if args == nil then
    args = {}
  elseif type(args) ~= 'table' then
    raise('args must be a table, got ' .. arg_type(args))
  end
  if not host('json_ok', args) then raise('args must be a JSON-representable table') end
  local l = local_by_alias[name]
  if ENGINE_TOOLS[name] or (l == nil and bound[name] == nil) then
    typed_error('unbound_tool', 'tool "' .. name .. '" is not bound in this run; bound aliases: '
      .. quoted(bound_order), { name = name }, 'Tool')
  end
  count_call(name)
  if l then return run_handler(l, args) end
  return call_bound(name, args)
end

return M
