package broker

import "sync"

// inflight counts the refreshes running. Unlike a sync.WaitGroup it may
// start new ones while another goroutine waits for the count to reach
// zero: refreshes start from RPCs at any time. The zero value is ready.
type inflight struct {
	mu   sync.Mutex // guards n
	n    int
	zero *sync.Cond // signalled when n reaches zero; made by the first wait
}

func (f *inflight) start() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inflight) end() {
	f.mu.Lock()
	f.n--
	if f.n == 0 && f.zero != nil {
		f.zero.Broadcast()
	}
	f.mu.Unlock()
}

// wait returns once no refresh is running.
func (f *inflight) wait() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.zero == nil {
		f.zero = sync.NewCond(&f.mu)
	}
	for f.n > 0 {
		f.zero.Wait()
	}
}
