package pool

import "testing"

// Holder finds the account whose idle head a conversation continues, and
// Forget drops that head for a conversation moving to another account.
func TestHolderAndForget(t *testing.T) {
	e := newEnv(t, nil)
	onB := part("sess-holder")
	onB.Account = "acct-b"
	first := items(user("hello"))
	l, err := e.pool.Acquire(t.Context(), onB, first)
	if err != nil {
		t.Fatal(err)
	}
	e.send(l, first)
	out := items(assistant("hi"))
	l.Complete(respID(1), out, Usage{})
	next := cat(first, out, items(user("more")))

	accounts := []string{"acct-a", "acct-b"}
	if got, ok := e.pool.Holder(part("sess-holder"), next, accounts); !ok || got != "acct-b" {
		t.Fatalf("Holder = %q, %v; want acct-b, true", got, ok)
	}
	if _, ok := e.pool.Holder(part("sess-other"), next, accounts); ok {
		t.Fatal("Holder found a head in another prompt cache key")
	}
	if _, ok := e.pool.Holder(part("sess-holder"), items(user("a new conversation")), accounts); ok {
		t.Fatal("Holder found a head for a conversation it does not continue")
	}
	if !e.pool.Forget(onB, next) {
		t.Fatal("Forget dropped nothing; want the head on acct-b")
	}
	if _, ok := e.pool.Holder(part("sess-holder"), next, accounts); ok {
		t.Fatal("Holder still finds the forgotten head")
	}
	if got := e.pool.Stats().Evictions[EvictMoved]; got != 1 {
		t.Fatalf("evictions %q = %d; want 1", EvictMoved, got)
	}
}
