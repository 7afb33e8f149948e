package codexsim

import (
	"bytes"
	"errors"
	"slices"

	"github.com/coder/websocket"
)

// SocketLog is what crossed one socket, as Server.Sockets returns it when
// Config.RecordFrames is set: what the backend's peer really sent and
// received, for in-process tests.
type SocketLog struct {
	// ID numbers the server's sockets from 1, in the order they were
	// accepted.
	ID uint64
	// Account is the ChatGPT account of the socket's token.
	Account string
	// Frames are the socket's messages in order, both directions.
	Frames []Frame
	// Closed reports that the socket has ended.
	Closed bool
	// CloseStatus is the status of the close frame the client sent, or -1
	// when the socket ended without one (the client closed the connection
	// without a close handshake, or the server ended it first). It is set
	// once Closed is.
	CloseStatus websocket.StatusCode
	// CloseReason is the reason of the client's close frame.
	CloseReason string
}

// Frame is one message on a recorded socket.
type Frame struct {
	// Seq orders frames across every socket of the server, from 1.
	Seq uint64
	// FromClient is true for a client frame (response.create), false for
	// an event the server sent.
	FromClient bool
	// Data is the message.
	Data []byte
}

// Sent returns the client frames of the log, in order.
func (l SocketLog) Sent() [][]byte { return l.frames(true) }

// Events returns the server's events of the log, in order.
func (l SocketLog) Events() [][]byte { return l.frames(false) }

func (l SocketLog) frames(fromClient bool) [][]byte {
	var out [][]byte
	for _, f := range l.Frames {
		if f.FromClient == fromClient {
			out = append(out, f.Data)
		}
	}
	return out
}

// Sockets returns a copy of every socket's log, in accept order (empty
// unless Config.RecordFrames is set). A client frame is logged when the
// server has read it, an event just before it is written (an event whose
// write failed stays logged), so a client that has read a response's
// terminal event finds the whole exchange in the log.
func (s *Server) Sockets() []SocketLog {
	s.recMu.Lock()
	defer s.recMu.Unlock()
	out := make([]SocketLog, len(s.records))
	for i, r := range s.records {
		out[i] = *r
		out[i].Frames = slices.Clone(r.Frames)
	}
	return out
}

// newRecord starts the log of a socket, when recording is on.
func (s *Server) newRecord(id uint64, account string, on bool) *SocketLog {
	if !on {
		return nil
	}
	r := &SocketLog{ID: id, Account: account, CloseStatus: -1}
	s.recMu.Lock()
	s.records = append(s.records, r)
	s.recMu.Unlock()
	return r
}

// record appends one frame to the socket's log (a no-op when the socket is
// not recorded).
func (ss *session) record(fromClient bool, data []byte) {
	if ss.rec == nil {
		return
	}
	s := ss.s
	s.recMu.Lock()
	defer s.recMu.Unlock()
	s.recSeq++
	ss.rec.Frames = append(ss.rec.Frames, Frame{Seq: s.recSeq, FromClient: fromClient, Data: bytes.Clone(data)})
}

// recordClose marks the socket's log closed with the error its last read
// ended with.
func (ss *session) recordClose(err error) {
	if ss.rec == nil {
		return
	}
	ss.s.recMu.Lock()
	defer ss.s.recMu.Unlock()
	ss.rec.Closed = true
	ss.rec.CloseStatus = websocket.CloseStatus(err)
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		ss.rec.CloseReason = ce.Reason
	}
}
