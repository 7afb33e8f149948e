package main

// readPages calls fetch with each page token in turn, from the empty one,
// until an answer's next page token is empty (or repeats the one asked
// with, which a server that ignores paging would answer), and returns the
// items of every page in order.
func readPages[T any](fetch func(token string) (items []T, next string, err error)) ([]T, error) {
	var out []T
	token := ""
	for {
		items, next, err := fetch(token)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" || next == token {
			return out, nil
		}
		token = next
	}
}
