-- PromptForge section VM: `models`, `messages` and `compactors` (chapters 10 and 11),
-- loaded on first use.
local P = ...
local host, cfg, raise, make_error = P.host, P.cfg, P.raise, P.make_error
local arg_type, check_string, math_type, suspend = P.arg_type, P.check_string, P.math_type, P.suspend
local in_shared_load, epoch = P.in_shared_load, P.epoch
-- Everything comes from P: this chunk runs after prompt code may have replaced globals.
local error, type, tostring, select, setmetatable = P.error, P.type, P.tostring, P.select, P.setmetatable
local string_match = P.string_match
local next, rawequal, rawget, math_type = P.next, P.rawequal, P.rawget, P.math_type

-- models (chapter 10).
local models = {}
models.use = function(...)
  local label, options = ...
  local handle, message = host('models_use', select('#', ...), label, options)
  if message then raise(message) end
  return handle
end
models.default = function(label)
  local handle, message = P.synced('models_default', label)
  if message then raise(message) end
  return handle
end
models.get = function(name)
  local handle, message = host('models_get', name)
  if message then raise(message) end
  return handle
end
models.infer = function(...)
  local n = select('#', ...)
  if n >= 3 then raise('models.infer takes (handle?, prompt)') end
  local handle, prompt = nil, ...
  if n == 2 then
    local a, b = ...
    if a ~= nil then
      if type(a) ~= 'userdata' then
        raise('models.infer handle must be a model handle, got ' .. arg_type(a))
      end
      if not host('is_handle', a) then raise('models.infer handle must be a model handle') end
      handle = a
    end
    prompt = b
  end
  check_string('prompt', prompt)
  local target, message = P.synced('round_model', handle)
  if message then
    error(make_error('internal', message, nil, { run_kind = 'Binding', epoch = epoch() }), 0)
  end
  local reply = suspend('model.infer', { model = target, prompt = prompt })
  if reply.tool_calls ~= nil and #reply.tool_calls > 0 then
    raise('model inference received tool calls but no tools were advertised')
  end
  return reply.text
end

-- messages (chapter 11): builder methods live on the list's metatable, never as fields.
local LIST_METHODS = {}
local LIST_MT = { __index = LIST_METHODS }
function LIST_METHODS.system(list, content)
  list[#list + 1] = { role = 'system', content = content }
  return list
end
function LIST_METHODS.user(list, content)
  list[#list + 1] = { role = 'user', content = content }
  return list
end
function LIST_METHODS.assistant(list, content, tool_calls)
  list[#list + 1] = { role = 'assistant', content = content, tool_calls = tool_calls }
  return list
end
function LIST_METHODS.tool(list, content, tool_call_id)
  list[#list + 1] = { role = 'tool', content = content, tool_call_id = tool_call_id }
  return list
end
function LIST_METHODS.append(list, record)
  list[#list + 1] = record
  return list
end
local messages = { new = function() return setmetatable({}, LIST_MT) end }

-- compactors: the shipped overflow policies.
local OVERFLOW_TEXT = {
  precheck = "context exhausted: the request precheck overflowed the model's context window",
  provider = "context exhausted: the provider rejected the request as exceeding the model's context window",
}
local compactors = {}
compactors.fail = function(tag)
  local text = OVERFLOW_TEXT[tag]
  if type(tag) ~= 'string' or text == nil then
    raise('unknown overflow reason "' .. tostring(tag) .. '"; expected "precheck" or "provider"')
  end
  error(make_error('context_exhausted', text, { reason = tag },
    { run_kind = 'ContextExhausted', epoch = epoch() }), 0)
end
local fail_compactor = compactors.fail

local COMPACTOR_RETURNED = 'the compactor returned instead of raising; a compactor must end '
  .. 'models.loop with an error, as compactors.fail does'

local function typed_error(kind, message, fields, run_kind)
  error(make_error(kind, message, fields, { run_kind = run_kind, epoch = epoch() }), 0)
end

-- Rounds that overflow go to the compactor, which must raise.
local function overflow(compactor, reason)
  compactor(reason)
  raise(COMPACTOR_RETURNED)
end

-- A models.loop list between rounds (loop_list.rs explains the scheme). The Rust side keeps
-- each checked record's snapshot, which names strings and tables by address (loop_walk.rs);
-- an anchor keeps every object a snapshot names alive, so no address in it is ever reused.
local function anchor(t, into, n)
  for k, v in next, t do
    into[n + 1], into[n + 2] = k, v
    n = n + 2
    if type(v) == 'table' then n = anchor(v, into, n) end
  end
  return n
end

-- Checks and composes the list (loop_list.rs); the records it checked anew are anchored.
-- The host's walk tells how many leading records were already checked (`p`, nil when the
-- whole list was checked afresh).
local function compose(state, list, target)
  local ok, fits, p = host('loop_compose', state.ud, list, target)
  if ok ~= nil then
    local anchors = state.anchors
    if p == nil then
      state.list, state.count = nil, 0
      for i = #anchors, 1, -1 do anchors[i] = nil end
    else
      local i = p + 1
      local v = rawget(list, i)
      while v ~= nil do
        local into = { v }
        if type(v) == 'table' then anchor(v, into, 1) end
        anchors[i] = into
        i = i + 1
        v = rawget(list, i)
      end
      for j = i, state.count do anchors[j] = nil end
      state.list, state.count = list, i - 1
    end
  end
  return ok, fits
end

models.loop = function(...)
  -- Every argument counts toward the arity, trailing nils included.
  local n = select('#', ...)
  local a, b, c = ...
  local handle, list, compactor
  if type(a) == 'userdata' then
    if not host('is_handle', a) then raise('models.loop handle must be a model handle') end
    if n > 3 then raise('models.loop takes (handle?, messages, compactor?)') end
    handle, list, compactor = a, b, c
  else
    if n > 2 then raise('models.loop takes (handle?, messages, compactor?)') end
    list, compactor = a, b
  end
  if type(list) ~= 'table' then
    raise('messages must be a table of message tables, got ' .. arg_type(list))
  end
  if compactor == nil then
    compactor = fail_compactor
  elseif type(compactor) ~= 'function' then
    raise('compactor must be a function, got ' .. arg_type(compactor))
  end
  -- The list's state for this call: what each round checked and composed (see loop_list.rs).
  local state = { ud = host('loop_list'), anchors = {}, count = 0 }
  local checked, message = compose(state, list)
  if checked == nil then raise(message) end
  local target, missing = P.synced('round_model', handle)
  if missing then typed_error('internal', missing, nil, 'Binding') end
  local answered, rounds = false, 0
  -- Whether the list still holds exactly what the check above composed.
  local composed_now = true
  while true do
    if rounds >= cfg.round_cap then
      typed_error('tool_loop_exhausted', 'tool-call loop did not converge', nil, 'Tool')
    end
    -- Task notices for this section's model join the list before the round.
    if P.has_model_tasks then
      local notices = P.module('tasks').notices()
      for i = 1, #notices do list[#list + 1] = { role = 'user', content = notices[i] } end
      if #notices > 0 then composed_now = false end
    end
    -- The section's model is looked up again for every round (unless a handle pins it).
    if handle == nil then
      target, missing = P.synced('round_model', nil)
      if missing then typed_error('internal', missing, nil, 'Binding') end
    end
    local composed, fits
    if composed_now then
      composed, fits = host('loop_fits', state.ud, target)
    else
      composed, fits = compose(state, list, target)
    end
    composed_now = false
    if composed == nil then raise(fits) end
    if not fits then overflow(compactor, 'precheck') end
    -- The scope is rebuilt for every round; the composed records travel in the state.
    local tools_module = P.module('tools')
    local specs, offered = tools_module.round_tools()
    local reply = suspend('model.loop', { model = target, tools = specs, messages = state.ud })
    if reply.overflow then overflow(compactor, 'provider') end
    rounds = rounds + 1
    -- The round's usage is filed; the first problem with its tool calls comes back, if any.
    local malformed = host('loop_reply', state.ud, target)
    local calls = reply.tool_calls or {}
    if #calls > 0 then
      if malformed then typed_error('internal', malformed, nil, 'Completion') end
      -- All or nothing: every name must be on offer before any tool runs.
      local on_offer = {}
      for i = 1, #offered do on_offer[offered[i]] = true end
      for i = 1, #calls do
        if not on_offer[calls[i].name] then tools_module.out_of_scope(calls[i].name, offered) end
      end
      -- Run each call in order, then append the batch: the assistant record with every
      -- call, then one tool record per call.
      local results = {}
      for i = 1, #calls do
        results[i] = tools_module.answer_call(calls[i].name, calls[i].arguments or {})
      end
      local recorded = {}
      for i = 1, #calls do
        recorded[i] = { id = calls[i].id, name = calls[i].name, arguments = calls[i].arguments or {} }
      end
      list[#list + 1] = { role = 'assistant', content = reply.text or '', tool_calls = recorded }
      for i = 1, #calls do
        list[#list + 1] = { role = 'tool', content = results[i], tool_call_id = calls[i].id }
      end
      answered = true
    else
      local text = reply.text or ''
      if string_match(text, '%S') then
        list[#list + 1] = { role = 'assistant', content = text }
        return nil
      end
      if answered and reply.finish_reason == 'stop' then
        list[#list + 1] = { role = 'assistant', content = '' }
        return nil
      end
      typed_error('empty_model_reply', 'the model replied with no text and no tool calls',
        { finish_reason = reply.finish_reason }, 'Completion')
    end
  end
end

return { models = models, messages = messages, compactors = compactors }
