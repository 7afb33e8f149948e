// Package console tests the control plane's web console in a real
// browser: headless Chromium (Debian's chromium), driven with chromedp,
// against real processes (clodex-sim, a control plane with its admin
// listener, two data planes, clodexctl). Each page it visits is saved as a
// PNG in the test's artifact directory (go test -artifacts; make
// console-shots).
package console
