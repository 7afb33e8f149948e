package console

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"slices"
	"strings"
	"time"
)

// chart is one SVG chart of an account's 24-hour history, drawn on the
// server: numbers and escaped names only, so the markup is safe to embed.
type chart struct {
	Title string
	SVG   template.HTML
}

// line is one series of a chart: a class (its colour, from console.css)
// and its values, NaN where it has none.
type line struct {
	name   string
	class  string
	values []float64
}

const (
	chartW, chartH = 720.0, 140.0
	padL, padB     = 44.0, 18.0
)

// charts draws the history: quota use per window, the rates, and the
// refusals and 403s per minute.
func charts(now time.Time, hist []point) []chart {
	if len(hist) == 0 {
		return nil
	}
	xs := make([]time.Time, len(hist))
	var names []string
	for i, p := range hist {
		xs[i] = p.At
		for n := range p.Used {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	var used []line
	for i, n := range names {
		l := line{name: n, class: fmt.Sprintf("s%d", i%4)}
		for _, p := range hist {
			v, ok := p.Used[n]
			if !ok {
				v = math.NaN()
			}
			l.values = append(l.values, v)
		}
		used = append(used, l)
	}
	rate := []line{{name: "configured", class: "s0"}, {name: "effective", class: "s1"}}
	bad := []line{{name: "refusals", class: "s2"}, {name: "403s", class: "s3"}}
	for _, p := range hist {
		rate[0].values = append(rate[0].values, float64(p.Rate))
		rate[1].values = append(rate[1].values, float64(p.Effective))
		bad[0].values = append(bad[0].values, p.RefusalsPerMin)
		bad[1].values = append(bad[1].values, p.ForbiddenPerMin)
	}
	var out []chart
	if len(used) > 0 {
		out = append(out, chart{Title: "Plan usage (% of each window)", SVG: draw(now, xs, used, 100)})
	}
	out = append(out,
		chart{Title: "New sockets per minute: configured and effective rate", SVG: draw(now, xs, rate, 0)},
		chart{Title: "Refusals and upstream 403s per minute (this replica)", SVG: draw(now, xs, bad, 0)})
	return out
}

// draw renders lines over the last 24 hours; top is the y axis' maximum
// (0: the data's, at least 1).
func draw(now time.Time, xs []time.Time, lines []line, top float64) template.HTML {
	if top <= 0 {
		top = 1
		for _, l := range lines {
			for _, v := range l.values {
				if !math.IsNaN(v) && v > top {
					top = v
				}
			}
		}
		top = niceCeil(top)
	}
	start := now.Add(-24 * time.Hour)
	x := func(t time.Time) float64 {
		f := t.Sub(start).Seconds() / (24 * time.Hour).Seconds()
		return padL + math.Max(0, math.Min(1, f))*(chartW-padL-4)
	}
	y := func(v float64) float64 { return 4 + (1-math.Max(0, math.Min(1, v/top)))*(chartH-padB-4) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" xmlns="http://www.w3.org/2000/svg">`, chartW, chartH)
	for _, f := range []float64{0, 0.5, 1} {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/><text class="axis" x="%.1f" y="%.1f">%s</text>`,
			padL, chartW-4, y(f*top), y(f*top), padL-4, y(f*top)+4, trimFloat(f*top))
	}
	for _, h := range []int{24, 18, 12, 6, 0} {
		t := now.Add(-time.Duration(h) * time.Hour)
		label, class := "now", "axis time end"
		if h > 0 {
			label, class = fmt.Sprintf("-%dh", h), "axis time"
		}
		fmt.Fprintf(&b, `<text class="%s" x="%.1f" y="%.1f">%s</text>`, class, x(t), chartH-4, label)
	}
	for _, l := range lines {
		var pts []string
		for i, v := range l.values {
			if math.IsNaN(v) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(xs[i]), y(v)))
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline class="%s" points="%s"/>`, l.class, strings.Join(pts, " "))
		}
		if len(pts) > 0 { // the latest value, marked: a young history is a few pixels long
			last := strings.Split(pts[len(pts)-1], ",")
			fmt.Fprintf(&b, `<circle class="%s" r="2.5" cx="%s" cy="%s"/>`, l.class, last[0], last[1])
		}
	}
	lx := padL + 6
	for _, l := range lines {
		fmt.Fprintf(&b, `<text class="legend %s" x="%.1f" y="14">%s</text>`, l.class, lx, html.EscapeString(l.name))
		lx += 10 + 7*float64(len(l.name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // G203: built from numbers and escaped names only
}

func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// drawHours draws an account's usage per hour over the last 24 hours as
// stacked bars: input not cached, cached input, output.
func drawHours(now time.Time, hours []hourPoint) template.HTML {
	top := 1.0
	for _, h := range hours {
		top = math.Max(top, float64(h.Input+h.Cached+h.Output))
	}
	top = niceCeil(top)
	start := now.Add(-24 * time.Hour)
	x := func(t time.Time) float64 {
		f := t.Sub(start).Seconds() / (24 * time.Hour).Seconds()
		return padL + math.Max(0, math.Min(1, f))*(chartW-padL-4)
	}
	y := func(v float64) float64 { return 4 + (1-math.Max(0, math.Min(1, v/top)))*(chartH-padB-4) }
	w := (chartW - padL - 4) / 25
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" xmlns="http://www.w3.org/2000/svg">`, chartW, chartH)
	for _, f := range []float64{0, 0.5, 1} {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/><text class="axis" x="%.1f" y="%.1f">%s</text>`,
			padL, chartW-4, y(f*top), y(f*top), padL-4, y(f*top)+4, tokenCount(f*top))
	}
	for _, h := range []int{24, 18, 12, 6, 0} {
		t := now.Add(-time.Duration(h) * time.Hour)
		label, class := "now", "axis time end"
		if h > 0 {
			label, class = fmt.Sprintf("-%dh", h), "axis time"
		}
		fmt.Fprintf(&b, `<text class="%s" x="%.1f" y="%.1f">%s</text>`, class, x(t), chartH-4, label)
	}
	for _, h := range hours {
		base := 0.0
		for i, v := range []int64{h.Input, h.Cached, h.Output} {
			if v <= 0 {
				continue
			}
			fmt.Fprintf(&b, `<rect class="s%d" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`,
				i, x(h.At), y(base+float64(v)), w*0.8, y(base)-y(base+float64(v)))
			base += float64(v)
		}
	}
	lx := padL + 6
	for i, name := range []string{"input", "cached", "output"} {
		fmt.Fprintf(&b, `<text class="legend s%d" x="%.1f" y="14">%s</text>`, i, lx, name)
		lx += 10 + 7*float64(len(name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // G203: built from numbers and fixed names only
}

// tokenCount prints a token count compactly: 950, 12k, 3.4M.
func tokenCount(v float64) string {
	switch {
	case v >= 1e6:
		return trimFloat(math.Round(v/1e5)/10) + "M"
	case v >= 1e3:
		return trimFloat(math.Round(v/1e2)/10) + "k"
	}
	return trimFloat(v)
}
