package main

import (
	"context"
	"io"
)

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

// listAll prints every item of a paged admin list: fetch reads one page
// (a failure goes through fail, which words it for the operator), viewOf
// turns each item into its view, and table prints them unless -o json.
func listAll[P, V any](ctx context.Context, e *env, fetch func(ctx context.Context, c *client, token string) ([]P, string, error),
	fail func(c *client, err error) error, viewOf func(P) V, table func(io.Writer, []V) error) error {
	var items []P
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) (err error) {
		items, err = readPages(func(token string) ([]P, string, error) { return fetch(ctx, c, token) })
		if err != nil {
			return fail(c, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	views := make([]V, 0, len(items))
	for _, it := range items {
		views = append(views, viewOf(it))
	}
	if e.g.output == "json" {
		return writeJSON(e.stdout, views)
	}
	return table(e.stdout, views)
}
