package translate

// countTokensDropped are the body fields the local estimate ignores
// (docs/translation.md §10).
var countTokensDropped = []string{"model", "stream", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "metadata"}

// imageTokens is the flat cost of one image in the local estimate.
const imageTokens = 1600

// CountTokens returns the local token estimate of an Anthropic request body
// (docs/translation.md §10), as served by /v1/messages/count_tokens: the body without
// model, stream, max_tokens, temperature, top_p, top_k, stop_sequences and
// metadata is serialised with every image block reduced to
// {"type":"image"}; the estimate is 0 for an empty object, else
// max(1, ceil(bytes/4) + 1600 per image). A body that is not a JSON object
// yields a *RequestError.
//
// The serialisation is that of the body's generic decoding (keys sorted,
// the last of duplicate keys kept, strings re-encoded, numbers as written);
// only its length matters, so it is computed without building it.
func CountTokens(body []byte) (int, error) {
	if jsonKind(body) != '{' {
		return 0, reqErr("", "Invalid JSON body: the request body must be a JSON object")
	}
	// Data after the object that starts with ']' or '}' has always been
	// ignored here (json.Decoder semantics); keep accepting it.
	d, ok := parseDoc(body, true)
	if !ok {
		return 0, reqErr("", "Invalid JSON body: the request body is not valid JSON")
	}
	defer d.release()
	return d.estimate(), nil
}

// estimate is the count_tokens estimate of the parsed object d.
func (d *jsonDoc) estimate() int {
	images := 0
	root := 0
	ms, base := d.members(root)
	kept := 0
	for _, m := range ms {
		if !isDroppedKey(m.key) {
			kept++
		}
	}
	d.keys = d.keys[:base]
	if kept == 0 {
		return 0
	}
	n := d.estimateLen(root, &images, countTokensDropped)
	return max(1, (n+3)/4+imageTokens*images)
}

func isDroppedKey(k string) bool {
	for _, d := range countTokensDropped {
		if k == d {
			return true
		}
	}
	return false
}
