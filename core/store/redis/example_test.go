package redis_test

import (
	"log"
	"time"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/redis"
)

// ExampleNew opens the Redis store (docs/stores.md shows this code):
// standalone from a URL, a Cluster from its seeds, Sentinel from the
// master's name. It needs a Redis, so it is compiled, not run.
func ExampleNew() {
	store, err := redis.New(redis.Options{Settings: redis.Settings{
		URL:     "redis://:secret@10.0.0.5:6379/0",
		Timeout: algo.Duration(200 * time.Millisecond),
	}})
	if err != nil {
		log.Fatal(err) // errors name the option and the value
	}
	defer store.Close()

	cluster := redis.Options{Settings: redis.Settings{Addrs: []string{"10.0.0.5:7000", "10.0.0.6:7000"}}, Cluster: true}
	sentinel := redis.Options{Settings: redis.Settings{Master: "mymaster", Addrs: []string{"10.0.0.7:26379"}}}
	_, _ = cluster, sentinel
}
