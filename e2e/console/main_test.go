package console

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// chromedp's allocator and target listeners end after the test's
		// contexts, on their own schedule.
		goleak.IgnoreTopFunction("github.com/chromedp/chromedp.(*Browser).run"),
		goleak.IgnoreAnyFunction("github.com/chromedp/chromedp.NewExecAllocator.func1"),
	)
}
