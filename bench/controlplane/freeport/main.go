// Command freeport prints a free TCP port on 127.0.0.1 (bind :0, close).
// The benchmark script uses it to place the control plane.
package main

import (
	"fmt"
	"net"
	"os"
)

func main() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "freeport:", err)
		os.Exit(1)
	}
	fmt.Println(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
}
