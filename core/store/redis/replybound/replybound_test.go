package replybound

import (
	"strconv"
	"strings"
	"testing"
)

// TestReplyBoundsChunked: the bounds hold however the bytes arrive, one at a
// time or all at once, and a reply within them passes whole.
func TestReplyBoundsChunked(t *testing.T) {
	good := "*3\r\n:1\r\n$5\r\nab\r\nc\r\n*2\r\n+OK\r\n$-1\r\n" + "$" + strconv.Itoa(MaxBulk) + "\r\n" + strings.Repeat("*", MaxBulk) + "\r\n%2\r\n+a\r\n:1\r\n+b\r\n:2\r\n"
	bad := "*1\r\n*" + strconv.Itoa(MaxElements+1) + "\r\n"
	for _, size := range []int{1, 2, 3, 7, 1 << 20} {
		var b replyBounds
		for i := 0; i < len(good); i += size {
			if err := b.scan([]byte(good[i:min(i+size, len(good))])); err != nil {
				t.Fatalf("chunks of %d: a good stream failed at %d: %v", size, i, err)
			}
		}
		if b.skip != 0 || b.lineLen != 0 {
			t.Fatalf("chunks of %d: the stream ended mid-reply (skip %d, line %d)", size, b.skip, b.lineLen)
		}
		var failed error
		for i := 0; i < len(bad) && failed == nil; i += size {
			failed = b.scan([]byte(bad[i:min(i+size, len(bad))]))
		}
		if failed == nil || !strings.Contains(failed.Error(), "elements") {
			t.Fatalf("chunks of %d: an over-long array passed: %v", size, failed)
		}
	}
}

// Checking a decision's reply allocates nothing: integer lines are not
// read, and a count or length is parsed without keeping a string.
func TestCheckingAReplyAllocatesNothing(t *testing.T) {
	stream := []byte("*7\r\n:7\r\n:1764460000123456\r\n:1\r\n:999999\r\n:1000\r\n:0\r\n$5\r\nhello\r\n")
	var b replyBounds
	if n := testing.AllocsPerRun(100, func() {
		if err := b.scan(stream); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations to check a reply, want 0", n)
	}
}
