//go:build !linux

package hosts

import "testing"

func TestHostsOverVeth(t *testing.T) {
	t.Skip("network namespaces and veth pairs are Linux only")
}
