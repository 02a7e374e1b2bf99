package gate

import (
	"context"
	"testing"
	"time"
)

func TestHoldRespectsClientCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Hold(ctx, time.Hour) {
		t.Fatal("Hold ignored the cancelled context")
	}
	if !Hold(context.Background(), 0) {
		t.Fatal("a zero hold did not pass")
	}
}
