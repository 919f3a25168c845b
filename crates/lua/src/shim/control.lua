-- PromptForge section VM: `untrusted`, `call`, `jump` and `fanout` (chapters 07, 08, 14),
-- loaded on a VM's first use of one of them.
local P = ...
local host, raise, arg_type, check_string = P.host, P.raise, P.arg_type, P.check_string
local math_type, suspend, in_shared_load = P.math_type, P.suspend, P.in_shared_load
-- Everything comes from P: this chunk runs after prompt code may have replaced globals.
local error, type, tostring, setmetatable = P.error, P.type, P.tostring, P.setmetatable

local control = {}

-- untrusted(s): the envelope, with the run's one nonce.
control.untrusted = function(s)
  if math_type(s) then s = tostring(s) end
  if type(s) ~= 'string' then raise('untrusted expects a string, got ' .. arg_type(s)) end
  return host('untrusted', s)
end

-- call and jump (chapter 08). The target's string check runs at the call; `call` suspends
-- until the called chain ends, and `jump` records its target and unwinds the block (pcall
-- cannot cancel it: the recorded jump wins when the block ends).
control.call = function(target, input)
  if type(target) ~= 'string' then
    raise('section target must be a string, got ' .. arg_type(target))
  end
  if input ~= nil then check_string('input', input) end
  return suspend('call', { target = target, input = input })
end

control.jump = function(target)
  if type(target) ~= 'string' then
    raise('section target must be a string, got ' .. arg_type(target))
  end
  if in_shared_load() then raise('jump is not available during shared library load') end
  if P.handler_depth > 0 then
    raise('jump is unavailable inside a local tool handler: return a value from the handler and '
      .. 'call jump from the block after the tool call returns')
  end
  host('jump', target)
  raise('jump to ' .. target)
end

-- fanout (chapter 14): the arms run in the Engine; the results come back as read-only
-- objects holding the caller's own members.
local RESULT_STAND_IN = { __tostring = function(r) return r.text end }
local function fanout_result(outcome, member)
  local fields = { text = outcome.text, ok = outcome.ok, exhausted = outcome.exhausted, item = member }
  return setmetatable({}, {
    __index = fields,
    __newindex = function() error('fanout results are read-only', 2) end,
    __tostring = function() return fields.text end,
    __metatable = RESULT_STAND_IN,
  })
end

control.fanout = function(worker, collection)
  if type(worker) ~= 'string' then
    raise('section target must be a string, got ' .. arg_type(worker))
  end
  if type(collection) ~= 'table' then
    raise("fanout's second parameter is a collection; for a list section use list_from_section(heading)")
  end
  local members, message = host('fanout_members', collection)
  if members == nil then raise(message) end
  local outcomes = suspend('fanout', { worker = worker, items = members })
  local results = {}
  for i = 1, #outcomes do results[i] = fanout_result(outcomes[i], members[i]) end
  return results
end

return control
