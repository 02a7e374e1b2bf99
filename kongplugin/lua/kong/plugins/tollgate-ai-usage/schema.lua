-- tollgate-ai-usage takes no configuration: enabling it on a route is the
-- whole of it (see handler.lua).
local typedefs = require "kong.db.schema.typedefs"

return {
  name = "tollgate-ai-usage",
  fields = {
    { protocols = typedefs.protocols_http },
    { config = { type = "record", fields = {} } },
  },
}
