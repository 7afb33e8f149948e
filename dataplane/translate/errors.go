package translate

// RequestError is a client error (HTTP 400 invalid_request_error). Field
// names the JSON path of the offending value, e.g.
// "messages[2].content[0].type"; it is empty when the body as a whole is
// bad (not JSON, not an object).
type RequestError struct {
	Field   string
	Message string
}

func (e *RequestError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}
