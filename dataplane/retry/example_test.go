package retry_test

import (
	"fmt"
	"time"

	"github.com/clodex/clodex/dataplane/retry"
)

// The waits before retries 1..5 by class, with no jitter drawn.
func ExampleWait() {
	for r := 1; r <= 5; r++ {
		fmt.Println(r,
			retry.Wait(retry.Backoff, r, 0, 0),
			retry.Wait(retry.Throttled, r, 5*time.Second, 0),
			retry.Wait(retry.Refused, r, 4*time.Second, 0))
	}
	// Output:
	// 1 2s 5s 4s
	// 2 4s 5s 4s
	// 3 8s 8s 4s
	// 4 16s 16s 4s
	// 5 32s 32s 4s
}
