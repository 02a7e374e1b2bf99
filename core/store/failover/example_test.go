package failover_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/failover"
	"github.com/tollgate/tollgate/core/store/redis"
)

// ExampleNew puts a Redis store behind the failure policy. With the zero
// Options (on_error local) a Redis that does not answer — here, nothing
// listens on the address — leaves the limit in force on this node: a
// memory store decides with the same limits until Redis answers again.
func ExampleNew() {
	shared, err := redis.New(redis.Options{Settings: redis.Settings{
		Addrs:   []string{"127.0.0.1:1"}, // no Redis here
		Timeout: algo.Duration(200 * time.Millisecond),
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer shared.Close()
	store, err := failover.New(shared, failover.Options{
		OnStateChange: func(open bool, err error) {
			if open {
				fmt.Println("breaker open: the failure policy decides") // log it: once per outage
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	policy := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.FixedWindow})
	limiter := core.NewLimiter(policy, store)
	for range 4 {
		var d core.Decision
		if err := limiter.Decide(context.Background(), "alice", 1, &d); err != nil {
			log.Fatal(err) // on_error fail only
		}
		fmt.Printf("allowed %v, decided by the fallback %v\n", d.Allowed, d.Fallback)
	}
	// Output:
	// allowed true, decided by the fallback true
	// allowed true, decided by the fallback true
	// breaker open: the failure policy decides
	// allowed false, decided by the fallback true
	// allowed false, decided by the fallback true
}
