-- PromptForge section VM: `xpcall`, built on a VM's first use of the name (vm.lua's LAZY
-- table). Like vm.lua's `pcall`, it hands back Engine error values, lets a cancel or a jump in
-- flight unwind to the Engine, and never lets its handler see a raw Rust failure. Receives
-- what it needs from vm.lua (`P`) and reads no globals.
local P = ...
local host, finish, normalize = P.host, P.finish, P.normalize
local error, type, select, xpcall = P.error, P.type, P.select, P.xpcall

return {
  global = function()
    return function(...)
      local f, handler = ...
      if type(handler) ~= 'function' then
        -- Stock Lua's own check and message (raised here: the stock one, called from this
        -- stripped chunk, would name the function '?').
        local got = select('#', ...) < 2 and 'no value' or type(handler)
        error("bad argument #2 to 'xpcall' (function expected, got " .. got .. ')', 0)
      end
      return finish(xpcall(f, function(e)
        if host('control_pending') then return e end
        return handler(normalize(e))
      end, select(3, ...)))
    end
  end,
}
