package translate

// countTokensDropped are the body fields the local estimate ignores
// (spec 8.4).
var countTokensDropped = []string{"model", "stream", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "metadata"}

// imageTokens is the flat cost of one image in the local estimate.
const imageTokens = 1600

// CountTokens returns the local token estimate of an Anthropic request body
// (spec 8.4), as served by /v1/messages/count_tokens: the body without
// model, stream, max_tokens, temperature, top_p, top_k, stop_sequences and
// metadata is serialised with every image block reduced to
// {"type":"image"}; the estimate is 0 for an empty object, else
// max(1, ceil(bytes/4) + 1600 per image). A body that is not a JSON object
// yields a *RequestError.
func CountTokens(body []byte) (int, error) {
	if jsonKind(body) != '{' {
		return 0, reqErr("", "Invalid JSON body: the request body must be a JSON object")
	}
	v, err := decodeAny(body)
	if err != nil {
		return 0, reqErr("", "Invalid JSON body: the request body is not valid JSON")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return 0, reqErr("", "Invalid JSON body: the request body must be a JSON object")
	}
	return estimateValue(m), nil
}

// estimateTokens is CountTokens for a body already validated by
// DecodeRequest.
func estimateTokens(body []byte) int {
	n, err := CountTokens(body)
	if err != nil {
		return 0
	}
	return n
}

func estimateValue(m map[string]any) int {
	for _, k := range countTokensDropped {
		delete(m, k)
	}
	if len(m) == 0 {
		return 0
	}
	images := 0
	v := reduceImages(m, &images)
	out, err := marshalNoEscape(v)
	if err != nil {
		return 0
	}
	n := (len(out)+3)/4 + imageTokens*images
	return max(1, n)
}

// reduceImages replaces every image block (type "image" with an object
// source) by {"type":"image"}, counting them.
func reduceImages(v any, images *int) any {
	switch x := v.(type) {
	case map[string]any:
		if x["type"] == "image" {
			if _, ok := x["source"].(map[string]any); ok {
				*images++
				return map[string]any{"type": "image"}
			}
		}
		for k, e := range x {
			x[k] = reduceImages(e, images)
		}
	case []any:
		for i, e := range x {
			x[i] = reduceImages(e, images)
		}
	}
	return v
}
