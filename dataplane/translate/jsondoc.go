package translate

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/clodex/clodex/internal/jsonstr"
)

// jsonDoc is a request body parsed once into a flat tree of value spans.
// The parser accepts exactly what json.Valid accepts (including its
// nesting limit); the accessors reproduce what encoding/json yields when it
// decodes the same value (unquoting, last duplicate key wins), so decoding
// a body needs one pass over its bytes instead of one per nesting level.
// Nothing in a jsonDoc may be kept after release: strings handed out are
// copies, byte slices handed out alias src (the caller's body).
type jsonDoc struct {
	src        []byte
	nodes      []jnode
	scratch    []byte    // unquoting buffer
	keys       []jmember // members stack (see members)
	scratchOut []byte    // canonical encoding buffer
}

// jnode is one JSON value: src[start:end] is its text. Object members
// carry their key's span (with quotes); the children of a container are
// linked by next from first.
type jnode struct {
	start, end       int
	keyStart, keyEnd int
	first, next      int  // -1 when none
	kind             byte // '{', '[', '"', '0' (number), 't', 'f', 'n'
	flags            byte
}

const (
	flagEscaped    = 1 << iota // a string (value) that is not plain printable ASCII without escapes
	flagKeyEscaped             // the member's key is not plain printable ASCII without escapes
	flagSpace                  // a container with insignificant whitespace somewhere inside
)

// maxNestingDepth is encoding/json's limit: deeper values are invalid.
const maxNestingDepth = 10000

var docPool = sync.Pool{New: func() any { return new(jsonDoc) }}

// parseDoc parses src. ok is false when src is not exactly one valid JSON
// value (surrounded by optional whitespace). When trailingOK is set, the
// value may be followed by data starting with ']' or '}', which is what
// json.Decoder followed by More and Token accepts after an object or an
// array (CountTokens keeps that behaviour; it only parses objects).
// Release the doc with release.
func parseDoc(src []byte, trailingOK bool) (*jsonDoc, bool) {
	d := docPool.Get().(*jsonDoc)
	d.src = src
	d.nodes = d.nodes[:0]
	p := jparser{d: d, src: src}
	p.value(0) // the root is node 0
	if p.err {
		d.release()
		return nil, false
	}
	p.skipSpace()
	if p.pos < len(src) && !(trailingOK && (src[p.pos] == ']' || src[p.pos] == '}')) {
		d.release()
		return nil, false
	}
	return d, true
}

// release returns d to the pool; d must not be used afterwards. Arenas
// grown by unusually large bodies are left to the garbage collector.
func (d *jsonDoc) release() {
	if cap(d.nodes) > 1<<14 || cap(d.keys) > 1<<12 || cap(d.scratch) > 1<<16 || cap(d.scratchOut) > 1<<16 {
		return
	}
	clear(d.keys[:cap(d.keys)]) // the keys alias the body
	d.keys = d.keys[:0]
	d.src = nil
	docPool.Put(d)
}

type jparser struct {
	d   *jsonDoc
	src []byte
	pos int
	err bool
}

func (p *jparser) skipSpace() bool {
	start := p.pos
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
			continue
		}
		break
	}
	return p.pos != start
}

// value parses one value at p.pos (after optional whitespace) and returns
// its node index; space reports whether insignificant whitespace was
// skipped inside it.
func (p *jparser) value(depth int) int {
	p.skipSpace()
	if p.pos >= len(p.src) {
		p.err = true
		return -1
	}
	idx := len(p.d.nodes)
	p.d.nodes = append(p.d.nodes, jnode{start: p.pos, first: -1, next: -1})
	var kind, flags byte
	switch c := p.src[p.pos]; {
	case c == '{':
		kind = '{'
		flags = p.object(idx, depth+1)
	case c == '[':
		kind = '['
		flags = p.array(idx, depth+1)
	case c == '"':
		kind = '"'
		if p.str() {
			flags = flagEscaped
		}
	case c == '-' || c >= '0' && c <= '9':
		kind = '0'
		p.number()
	case c == 't':
		kind = 't'
		p.literal("true")
	case c == 'f':
		kind = 'f'
		p.literal("false")
	case c == 'n':
		kind = 'n'
		p.literal("null")
	default:
		p.err = true
	}
	if p.err {
		return -1
	}
	n := &p.d.nodes[idx]
	n.kind, n.flags, n.end = kind, flags, p.pos
	return idx
}

func (p *jparser) literal(lit string) {
	if len(p.src)-p.pos < len(lit) || string(p.src[p.pos:p.pos+len(lit)]) != lit {
		p.err = true
		return
	}
	p.pos += len(lit)
}

func (p *jparser) number() {
	s, i := p.src, p.pos
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		p.err = true
		return
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			p.err = true
			return
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			p.err = true
			return
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	p.pos = i
}

// str scans a string literal at p.pos; escaped reports whether it holds an
// escape or a byte outside printable ASCII (so its text differs from, or
// may differ from, its decoded and re-encoded form).
func (p *jparser) str() (escaped bool) {
	s := p.src
	i := p.pos + 1
	for {
		// Fast scan over plain bytes.
		for i+8 <= len(s) {
			x := jsonstr.Load64(s, i)
			if jsonstr.Special(x) != 0 {
				break
			}
			if x&jsonstr.High != 0 {
				escaped = true
			}
			i += 8
		}
		for i < len(s) {
			c := s[i]
			if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
				break
			}
			i++
		}
		if i >= len(s) {
			p.err = true
			return false
		}
		switch c := s[i]; {
		case c == '"':
			p.pos = i + 1
			return escaped
		case c < 0x20:
			p.err = true
			return false
		case c >= utf8.RuneSelf:
			escaped = true
			i++
		default: // backslash
			escaped = true
			if i+1 >= len(s) {
				p.err = true
				return false
			}
			switch s[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(s) || !isHex(s[i+2]) || !isHex(s[i+3]) || !isHex(s[i+4]) || !isHex(s[i+5]) {
					p.err = true
					return false
				}
				i += 6
			default:
				p.err = true
				return false
			}
		}
	}
}

func (p *jparser) object(idx, depth int) byte {
	if depth > maxNestingDepth {
		p.err = true
		return 0
	}
	var flags byte
	p.pos++ // '{'
	if p.skipSpace() {
		flags |= flagSpace
	}
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		return flags
	}
	prev := -1
	for {
		if p.pos >= len(p.src) || p.src[p.pos] != '"' {
			p.err = true
			return 0
		}
		keyStart := p.pos
		keyEsc := p.str()
		if p.err {
			return 0
		}
		keyEnd := p.pos
		if p.skipSpace() {
			flags |= flagSpace
		}
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			p.err = true
			return 0
		}
		p.pos++
		if p.pos < len(p.src) && isSpace(p.src[p.pos]) {
			flags |= flagSpace
		}
		child := p.value(depth)
		if p.err {
			return 0
		}
		c := &p.d.nodes[child]
		c.keyStart, c.keyEnd = keyStart, keyEnd
		if keyEsc {
			c.flags |= flagKeyEscaped
		}
		flags |= c.flags & flagSpace
		if prev < 0 {
			p.d.nodes[idx].first = child
		} else {
			p.d.nodes[prev].next = child
		}
		prev = child
		if p.skipSpace() {
			flags |= flagSpace
		}
		if p.pos >= len(p.src) {
			p.err = true
			return 0
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
			if p.skipSpace() {
				flags |= flagSpace
			}
		case '}':
			p.pos++
			return flags
		default:
			p.err = true
			return 0
		}
	}
}

func (p *jparser) array(idx, depth int) byte {
	if depth > maxNestingDepth {
		p.err = true
		return 0
	}
	var flags byte
	p.pos++ // '['
	if p.skipSpace() {
		flags |= flagSpace
	}
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		return flags
	}
	prev := -1
	for {
		if p.pos < len(p.src) && isSpace(p.src[p.pos]) {
			flags |= flagSpace
		}
		child := p.value(depth)
		if p.err {
			return 0
		}
		flags |= p.d.nodes[child].flags & flagSpace
		if prev < 0 {
			p.d.nodes[idx].first = child
		} else {
			p.d.nodes[prev].next = child
		}
		prev = child
		if p.skipSpace() {
			flags |= flagSpace
		}
		if p.pos >= len(p.src) {
			p.err = true
			return 0
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return flags
		default:
			p.err = true
			return 0
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// validJSON is json.Valid without the allocation-heavy scanner.
func validJSON(b []byte) bool {
	d, ok := parseDoc(b, false)
	if ok {
		d.release()
	}
	return ok
}

// kind returns the node's kind, or 0 for i < 0 (absent).
func (d *jsonDoc) kind(i int) byte {
	if i < 0 {
		return 0
	}
	return d.nodes[i].kind
}

// null reports whether i is absent or the literal null.
func (d *jsonDoc) null(i int) bool { k := d.kind(i); return k == 0 || k == 'n' }

func (d *jsonDoc) raw(i int) []byte { n := &d.nodes[i]; return d.src[n.start:n.end:n.end] }

// count returns the number of children of a container.
func (d *jsonDoc) count(i int) int {
	n := 0
	for c := d.nodes[i].first; c >= 0; c = d.nodes[c].next {
		n++
	}
	return n
}

// unquoteTo appends the decoded text of the string literal lit to dst,
// exactly as encoding/json decodes it: escapes resolved, a lone or
// malformed surrogate and every invalid UTF-8 byte become U+FFFD.
func unquoteTo(dst, lit []byte) []byte {
	s := lit[1 : len(lit)-1]
	for i := 0; i < len(s); {
		if j := jsonstr.Plain(s, i); j > i {
			dst = append(dst, s[i:j]...)
			if i = j; i >= len(s) {
				break
			}
		}
		c := s[i]
		switch {
		case c == '\\':
			i++
			switch e := s[i]; e {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(s[i+1:])
				i += 5 // past the 4 hex digits
				if utf16.IsSurrogate(r) {
					if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, hex4(s[i+2:])); dec != utf8.RuneError {
							dst = utf8.AppendRune(dst, dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default: // " \ /
				dst = append(dst, e)
			}
			i++
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
		}
	}
	return dst
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// str returns the decoded text of string node i.
func (d *jsonDoc) str(i int) string {
	n := &d.nodes[i]
	if n.flags&flagEscaped == 0 {
		return string(d.src[n.start+1 : n.end-1])
	}
	b := unquoteTo(make([]byte, 0, n.end-n.start), d.src[n.start:n.end])
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is never written again
}

// key returns the decoded key of member i, valid until the next call that
// uses the scratch buffer; plain keys alias src.
func (d *jsonDoc) key(i int) []byte {
	n := &d.nodes[i]
	if n.flags&flagKeyEscaped == 0 {
		return d.src[n.keyStart+1 : n.keyEnd-1]
	}
	d.scratch = unquoteTo(d.scratch[:0], d.src[n.keyStart:n.keyEnd])
	return d.scratch
}

// get returns the last member of object i whose key is name (what
// decoding into a map keeps), or -1.
func (d *jsonDoc) get(i int, name string) int {
	found := -1
	for c := d.nodes[i].first; c >= 0; c = d.nodes[c].next {
		if string(d.key(c)) == name {
			found = c
		}
	}
	return found
}

// getFold returns the last member of object i whose key matches name
// case-insensitively, as encoding/json matches struct fields, or -1.
func (d *jsonDoc) getFold(i int, name string) int {
	found := -1
	for c := d.nodes[i].first; c >= 0; c = d.nodes[c].next {
		if bytes.EqualFold(d.key(c), []byte(name)) {
			found = c
		}
	}
	return found
}

// compact returns value i without insignificant whitespace (json.Compact):
// its own text when it has none.
func (d *jsonDoc) compact(i int) []byte {
	n := &d.nodes[i]
	raw := d.src[n.start:n.end:n.end]
	if n.flags&flagSpace == 0 {
		return raw
	}
	return compactJSON(raw)
}

// bstr views b as a string without copying; b must not change while the
// string is in use.
func bstr(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// jsonKind returns the first significant byte of a JSON value, or 0 when
// raw is empty or all whitespace.
func jsonKind(raw json.RawMessage) byte {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

// appendInt appends the decimal form of n.
func appendInt(dst []byte, n int) []byte { return strconv.AppendInt(dst, int64(n), 10) }

// compactJSON returns raw without insignificant whitespace. Raw must be
// valid JSON (it came out of the decoder).
func compactJSON(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return append([]byte(nil), raw...)
	}
	return b.Bytes()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
