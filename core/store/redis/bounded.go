package redis

import (
	"context"
	"net"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/store/redis/replybound"
)

// maxBatch is the most decisions one batch may carry, so that its reply
// stays within replybound.MaxElements: each request answers its length,
// then at most 1 + 5 values and 65 state values a limit (or -1 and its
// error): (2 + 5 + 65) values a limit, 64 KiB of interface values at most.
const maxBatch = replybound.MaxElements / (2 + core.MaxLimits*(5+65))

// newBoundedDialer is go-redis's own dialer (TLS included), its replies'
// claims bounded (replybound).
func newBoundedDialer(uo *goredis.UniversalOptions) func(context.Context, string, string) (net.Conn, error) {
	return replybound.Dialer(goredis.NewDialer(&goredis.Options{DialTimeout: uo.DialTimeout, TLSConfig: uo.TLSConfig}))
}
