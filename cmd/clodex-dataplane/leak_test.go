package main

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine run starts has stopped when it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
