//go:build kongreal

package kongreal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/redistest"
)

// TestKongExampleConfig loads kong.yml.example into real Kong as it is,
// but for its upstream (a local one for httpbin.org) and its Redis (a
// local redis-server for the host "redis"), and sends its routes what a
// user would: each limit holds, the Redis policy counts in Redis.
func TestKongExampleConfig(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join(root, "kong.yml.example"))
	if err != nil {
		t.Fatal(err)
	}
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	host, port, _ := strings.Cut(rds.Addr, ":")
	config := string(example)
	for old, new := range map[string]string{
		"url: http://httpbin.org/anything": "url: " + up.URL,
		"host: redis":                      "host: " + host,
		"port: 6379":                       "port: " + port,
	} {
		if !strings.Contains(config, old) {
			t.Fatalf("kong.yml.example no longer has %q: update this test with it", old)
		}
		config = strings.ReplaceAll(config, old, new)
	}
	k := Start(t, Options{Declarative: config})

	// search: second 5 by X-API-Key, policy local.
	var answers []Answer
	for i := 0; i < 60 && (len(answers) == 0 || answers[len(answers)-1].Status != 429); i++ {
		answers = append(answers, k.Get("/search", "X-API-Key: k1"))
	}
	last := answers[len(answers)-1]
	if last.Status != 429 || last.Headers.Get("X-Ratelimit-Limit-Second") != "5" || !strings.Contains(last.Body, "API rate limit exceeded") {
		t.Errorf("/search: %d requests, the last %s; want a 429 of the 5-a-second limit", len(answers), last)
	}
	if other := k.Get("/search", "X-API-Key: k2"); other.Status != 200 {
		t.Errorf("/search with another key: %s, want 200 (its own count)", other)
	}

	// orders: minute 600, hour 3600 and 20 per 10 s (token bucket, burst
	// 20) by consumer (none here: the client address), policy redis.
	var statuses []int
	for i := 0; i < 40 && (len(statuses) == 0 || statuses[len(statuses)-1] != 429); i++ {
		a := k.Get("/orders")
		statuses = append(statuses, a.Status)
		if i == 0 && (a.Headers.Get("X-Ratelimit-Limit-Minute") != "600" || a.Headers.Get("X-Ratelimit-Limit-Hour") != "3600") {
			t.Errorf("/orders, first answer: %s, want Kong's headers for minute 600 and hour 3600", a)
		}
	}
	if n := len(statuses); n < 21 || statuses[n-1] != 429 || fmt.Sprint(statuses[:20]) != fmt.Sprint(make20(200)) {
		t.Errorf("/orders: statuses %v, want 20 admitted (the burst) and then a 429", statuses)
	}
	c := goredis.NewClient(&goredis.Options{Addr: rds.Addr})
	defer c.Close()
	if keys, err := c.Keys(context.Background(), "tollgate:*").Result(); err != nil || len(keys) == 0 {
		t.Errorf("no tollgate keys in Redis after /orders (policy redis): %v %v", keys, err)
	}
}

func make20(v int) []int {
	out := make([]int, 20)
	for i := range out {
		out[i] = v
	}
	return out
}
