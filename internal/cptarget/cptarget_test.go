package cptarget

import (
	"slices"
	"testing"
)

// A single address is gRPC's DNS target and needs no resolver; a list gets
// the connection's own resolver holding every address.
func TestTargets(t *testing.T) {
	one, err := Parse("cp.example:17700")
	if err != nil || one.Target != "dns:///cp.example:17700" || one.Addrs != nil || len(one.DialOptions()) != 0 {
		t.Errorf("Parse(one) = %+v, %v, %d options; want the DNS target and no resolver", one, err, len(one.DialOptions()))
	}
	list, err := Parse("a:1, b:2")
	if err != nil || list.Target != listScheme+":///controlplanes" || !slices.Equal(list.Addrs, []string{"a:1", "b:2"}) || len(list.DialOptions()) != 1 {
		t.Errorf("Parse(list) = %+v, %v, %d options; want both addresses and one resolver option", list, err, len(list.DialOptions()))
	}
}
