-- tollgate-ai-usage hands tollgate-response the usage a streamed language
-- model answer reports, which a Go plugin cannot see: Kong gives plugin
-- servers no body_filter phase, and Kong's ai-proxy logs its own estimate
-- of an OpenAI-format stream, not the usage the stream carries
-- (kong/llm/plugin/shared-filters/normalize-sse-chunk.lua, Kong 3.9.3).
--
-- It reads the stream as the client gets it (its priority is below
-- ai-proxy's 770, so after ai-proxy's body_filter has written it) and
-- keeps, in kong.ctx.shared.tollgate_ai_usage, its last few "data:" lines
-- that carry a "usage" key, as they were. It parses no JSON: tollgate
-- reads those lines in its log phase with the same reader it uses for any
-- answer (core/usage). Memory is bounded: a partial line is kept up to
-- MAX_LINE bytes (a longer one is skipped to its end), and at most
-- MAX_KEPT lines.

local find, sub, lower = string.find, string.sub, string.lower
local concat, remove = table.concat, table.remove

local MAX_LINE = 8192 -- bytes: a usage line is a few hundred
local MAX_KEPT = 4    -- lines: a stream's latest usage is its last

local handler = {
  PRIORITY = 769,
  VERSION = "1.0.0",
}

function handler:header_filter(_)
  local ct = kong.response.get_header("Content-Type")
  if type(ct) == "string" and find(lower(ct), "text/event-stream", 1, true) then
    kong.ctx.plugin.sse = { kept = {} }
  end
end

-- keep keeps a whole line that is an SSE data line with a usage key.
local function keep(state, line)
  if #line > MAX_LINE or sub(line, 1, 5) ~= "data:" or not find(line, '"usage', 6, true) then
    return
  end
  local kept = state.kept
  kept[#kept + 1] = line
  if #kept > MAX_KEPT then
    remove(kept, 1)
  end
  kong.ctx.shared.tollgate_ai_usage = concat(kept, "\n\n")
end

function handler:body_filter(_)
  local state = kong.ctx.plugin.sse
  local chunk = ngx.arg[1]
  if not state or type(chunk) ~= "string" or chunk == "" then
    return
  end
  local pos, len = 1, #chunk
  while pos <= len do
    local nl = find(chunk, "\n", pos, true)
    local piece = sub(chunk, pos, (nl or len + 1) - 1)
    if not state.skipping then
      local line = state.partial and (state.partial .. piece) or piece
      state.partial = nil
      if nl then
        keep(state, line)
      elseif #line > MAX_LINE then
        state.skipping = true -- too long to be usage: skip to its end
      else
        state.partial = line
      end
    end
    if not nl then
      break
    end
    state.skipping = false
    pos = nl + 1
  end
end

return handler
