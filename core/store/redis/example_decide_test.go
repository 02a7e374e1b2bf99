package redis

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// ExampleStore_Decide decides on a real Redis (the test suite's server:
// use your own address): every gateway node that opens the store on the
// same Redis shares one exact limit.
func ExampleStore_Decide() {
	store, err := New(Options{Settings: Settings{
		Addrs:   []string{standalone.Addr},
		Timeout: algo.Duration(time.Second),
		Prefix:  fmt.Sprintf("t-example%d:", time.Now().UnixNano()), // keeps this run's counts apart
	}})
	if err != nil {
		log.Fatal(err) // errors name the option and the value
	}
	defer store.Close()
	policy := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.SlidingLog})
	limiter := core.NewLimiter(policy, store)
	for range 3 {
		var d core.Decision
		if err := limiter.Decide(context.Background(), "alice", 1, &d); err != nil {
			log.Fatal(err) // Redis did not answer: put the store behind failover.New
		}
		fmt.Printf("allowed %v, remaining %d\n", d.Allowed, d.Remaining)
	}
	// Output:
	// allowed true, remaining 1
	// allowed true, remaining 0
	// allowed false, remaining 0
}
