-- PromptForge section VM: the `tasks` namespace (chapter 15), loaded on a VM's first use.
-- Arguments are checked here, in the order and with the messages the chapter gives; the
-- Engine answers every call (ownership, delivery, waits) through `suspend`.
local P = ...
local host, raise, make_error, arg_type, check_string = P.host, P.raise, P.make_error, P.arg_type, P.check_string
local math_type, suspend, epoch, unwrap = P.math_type, P.suspend, P.epoch, P.unwrap
-- Everything comes from P: this chunk runs after prompt code may have replaced globals.
local type, tostring = P.type, P.tostring

local tasks = {}

-- A task argument: a Task handle (any table with a string `task` field, read through
-- metatables so a handle kept in `var` works) or a bare id string.
local function task_id(call, v)
  local id = v
  if type(v) == 'table' then id = v.task end
  if type(id) ~= 'string' then
    raise(call .. ' expects a Task handle or task id, got ' .. arg_type(v))
  end
  if not host('task_id_ok', id) then
    raise('`' .. id .. '` is not a task id: required a dot-separated path such as `0.1`')
  end
  return id
end

-- A failed or cancelled member's error value, fresh at the wait that returned it.
local function error_value(e)
  return make_error(e.kind, e.message, e.fields, { run_kind = e.run_kind, epoch = epoch() })
end

-- A results entry: itself a Task handle.
local function entry(r)
  if r.ok then return { task = r.task, ok = true, result = r.result } end
  return { task = r.task, ok = false, result = error_value(r.error) }
end

tasks.spawn = function(target, opts)
  if type(target) ~= 'string' then
    raise('section target must be a string, got ' .. arg_type(target))
  end
  local payload = { target = target }
  if opts ~= nil then
    if type(opts) ~= 'table' then
      raise('tasks.spawn opts must be a table, got ' .. arg_type(opts))
    end
    local input, item, index = opts.input, opts.item, opts.index
    if input ~= nil then
      check_string('input', input)
      payload.input = input
    end
    if item ~= nil then
      local t = type(item)
      if t == 'function' or t == 'userdata' or t == 'thread' then
        raise('item must be JSON data, got ' .. t)
      end
      item = unwrap(item)
      if not host('json_ok', item) then raise('item must be a JSON-representable value') end
      payload.item, payload.has_item = item, true
    end
    if index ~= nil then
      if math_type(index) ~= 'integer' then
        raise('index must be a non-negative integer, got ' .. arg_type(index))
      end
      if index < 0 then raise('index must be a non-negative integer, got ' .. tostring(index)) end
      payload.index = index
    end
  end
  local r = suspend('tasks.spawn', payload)
  return { task = r.task }
end

-- A wait set: a Lua array of handles or ids, read up to its first hole; each member is
-- checked, and one malformed member fails the whole call.
local function wait_members(call, set)
  if type(set) ~= 'table' then raise(call .. ' expects a set of tasks, got ' .. arg_type(set)) end
  local members, i = {}, 1
  while true do
    local v = set[i]
    if v == nil then break end
    members[i] = task_id(call, v)
    i = i + 1
  end
  if i == 1 then raise(call .. ' requires at least one task') end
  return members
end

-- A wait's options: nil, or a table whose `timeout` is nil or a count of seconds that a
-- duration can hold.
local function wait_timeout(call, opts)
  if opts == nil then return nil end
  if type(opts) ~= 'table' then raise(call .. ' opts must be a table, got ' .. arg_type(opts)) end
  local t = opts.timeout
  if t == nil then return nil end
  if type(t) ~= 'number' then raise(call .. ' timeout must be a number, got ' .. arg_type(t)) end
  if t ~= t or t < 0 or t >= 18446744073709551616.0 then
    raise('timeout must be a non-negative finite number of seconds, got ' .. tostring(t))
  end
  return t
end

tasks.join_any = function(set, opts)
  local members = wait_members('tasks.join_any', set)
  local timeout = wait_timeout('tasks.join_any', opts)
  local r = suspend('tasks.join_any', { members = members, timeout = timeout })
  if r == nil then return nil end
  local e = entry(r)
  return { task = e.task }, e.ok, e.result
end

tasks.join = function(set, opts)
  local members = wait_members('tasks.join', set)
  local timeout = wait_timeout('tasks.join', opts)
  local r = suspend('tasks.join', { members = members, timeout = timeout })
  local results, got = {}, r.results
  for i = 1, #members do
    local x = got[i]
    if x ~= nil then results[i] = entry(x) end
  end
  return results, r.timed_out
end

tasks.concurrency = function(...)
  local n = ...
  if n == nil then return suspend('tasks.concurrency', {}) end
  local whole = math_type(n) == 'integer' or (math_type(n) == 'float' and n % 1 == 0)
  if not whole or n < 1 then
    raise('tasks.concurrency limit must be a positive whole number, got ' .. arg_type(n))
  end
  if n > 4294967295 then n = 4294967295 end
  return suspend('tasks.concurrency', { limit = n | 0 })
end

tasks.ready = function(t)
  return suspend('tasks.ready', { task = task_id('tasks.ready', t) })
end

tasks.status = function(t)
  return suspend('tasks.status', { task = task_id('tasks.status', t) })
end

tasks.pending = function(filter)
  local origin
  if filter ~= nil then
    if type(filter) ~= 'table' then
      raise('tasks.pending filter must be a table, got ' .. arg_type(filter))
    end
    origin = filter.origin
    if origin ~= nil then
      if type(origin) ~= 'string' then
        raise('pending filter origin must be a string, got ' .. arg_type(origin))
      end
      if not host('utf8_ok', origin) then
        raise('pending filter origin must be a valid UTF-8 string')
      end
      if origin ~= 'author' and origin ~= 'model' then
        raise('pending filter origin must be `author` or `model`, got `' .. origin .. '`')
      end
    end
  end
  return suspend('tasks.pending', { origin = origin })
end

tasks.note = function(text)
  if type(text) ~= 'string' then
    raise('tasks.note text must be a string, got ' .. arg_type(text))
  end
  if not host('utf8_ok', text) then raise('text must be a valid UTF-8 string') end
  suspend('tasks.note', { text = text })
end

tasks.cancel = function(t)
  suspend('tasks.cancel', { task = task_id('tasks.cancel', t) })
end

-- The model's task built-ins, called from models.loop: the Engine answers with the tool
-- record's text.
tasks.model_tool = function(name, args, allowed)
  local list = nil
  if allowed ~= true then list = allowed end
  local r = suspend('tasks.tool', { name = name, args = args, allow = list })
  if r.started then P.has_model_tasks = true end
  return r.text
end

-- The task notices waiting for this section, taken for the next round.
tasks.notices = function()
  return suspend('tasks.notices', {})
end

return tasks
