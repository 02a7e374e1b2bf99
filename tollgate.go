// Package tollgate is a rate limiter for API gateways. The library is in
// core/ (algorithms, stores, headers), the Kong plugin in kongplugin/ and the
// Caddy module in caddymodule/. Importing this package registers the Caddy
// module, which is what `xcaddy build --with github.com/tollgate/tollgate`
// does.
package tollgate

import _ "github.com/tollgate/tollgate/caddymodule" // registers http.handlers.tollgate
