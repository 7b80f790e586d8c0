package messages

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The JSON forms of the package's types (the CLI's -O json and the HTTP API print
// them): durations are whole milliseconds in fields named *_ms, the unit the API's
// requests take; a lease token is 32 hex digits; a peeked message has no receipt.

// MarshalJSON writes VisibilityTimeout as visibility_timeout_ms.
func (q QueueInfo) MarshalJSON() ([]byte, error) {
	type plain QueueInfo
	return json.Marshal(struct {
		plain
		VisibilityTimeout int64 `json:"visibility_timeout_ms"`
	}{plain(q), q.VisibilityTimeout.Milliseconds()})
}

// UnmarshalJSON reads the form MarshalJSON writes.
func (q *QueueInfo) UnmarshalJSON(b []byte) error {
	type plain QueueInfo
	var v struct {
		*plain
		VisibilityTimeout int64 `json:"visibility_timeout_ms"`
	}
	v.plain = (*plain)(q)
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	q.VisibilityTimeout = time.Duration(v.VisibilityTimeout) * time.Millisecond
	return nil
}

// MarshalJSON writes OldestAge as oldest_age_ms.
func (s QueueStats) MarshalJSON() ([]byte, error) {
	type plain QueueStats
	return json.Marshal(struct {
		plain
		OldestAge int64 `json:"oldest_age_ms"`
	}{plain(s), s.OldestAge.Milliseconds()})
}

// UnmarshalJSON reads the form MarshalJSON writes.
func (s *QueueStats) UnmarshalJSON(b []byte) error {
	type plain QueueStats
	var v struct {
		*plain
		OldestAge int64 `json:"oldest_age_ms"`
	}
	v.plain = (*plain)(s)
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	s.OldestAge = time.Duration(v.OldestAge) * time.Millisecond
	return nil
}

// MarshalJSON writes the lease token as 32 hex digits.
func (r Receipt) MarshalJSON() ([]byte, error) {
	type plain Receipt
	return json.Marshal(struct {
		plain
		LeaseToken string `json:"lease_token"`
	}{plain(r), hex.EncodeToString(r.LeaseToken[:])})
}

// UnmarshalJSON reads a lease token as 32 hex digits (with or without the dashes of
// a UUID), or as the array of 16 bytes earlier versions wrote.
func (r *Receipt) UnmarshalJSON(b []byte) error {
	type plain Receipt
	var v struct {
		*plain
		LeaseToken json.RawMessage `json:"lease_token"`
	}
	v.plain = (*plain)(r)
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	r.LeaseToken = [16]byte{}
	if len(v.LeaseToken) == 0 || string(v.LeaseToken) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(v.LeaseToken, &s); err == nil {
		tok, err := parseToken(s)
		if err != nil {
			return err
		}
		r.LeaseToken = tok
		return nil
	}
	return json.Unmarshal(v.LeaseToken, &r.LeaseToken)
}

func parseToken(s string) ([16]byte, error) {
	var tok [16]byte
	raw, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil || len(raw) != 16 {
		return tok, invalid(ErrInvalidArgument, "lease token %q: want 32 hex digits", s)
	}
	copy(tok[:], raw)
	return tok, nil
}

// ParseReceipt reads a receipt in the form Receipt.String writes:
// queue/offset/lease-token. ErrInvalidArgument when it is not one.
func ParseReceipt(s string) (Receipt, error) {
	i := strings.LastIndex(s, "/")
	j := -1
	if i > 0 {
		j = strings.LastIndex(s[:i], "/")
	}
	if i < 0 || j <= 0 {
		return Receipt{}, invalid(ErrInvalidArgument, "receipt %q: want QUEUE/OFFSET/TOKEN as receive prints it", s)
	}
	off, err := strconv.ParseInt(s[j+1:i], 10, 64)
	if err != nil || off < 0 {
		return Receipt{}, invalid(ErrInvalidArgument, "receipt %q: offset %q is not a non-negative integer", s, s[j+1:i])
	}
	tok, err := parseToken(s[i+1:])
	if err != nil {
		return Receipt{}, fmt.Errorf("receipt %q: %w", s, err)
	}
	if err := checkName(s[:j]); err != nil {
		return Receipt{}, fmt.Errorf("receipt %q: %w", s, err)
	}
	return Receipt{Queue: s[:j], Offset: off, LeaseToken: tok}, nil
}

// MarshalJSON leaves out the receipt of a message that has none (a peeked one).
func (m Message) MarshalJSON() ([]byte, error) {
	type plain Message
	if m.Receipt.LeaseToken != ([16]byte{}) {
		return json.Marshal(struct {
			plain
			ReceiptHandle string `json:"receipt_handle"`
		}{plain(m), m.Receipt.String()})
	}
	return json.Marshal(struct {
		plain
		Receipt *Receipt `json:"receipt,omitempty"`
	}{plain: plain(m)})
}
