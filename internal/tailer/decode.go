package tailer

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
)

// relation is what the decoder keeps of a published table: which columns hold the
// name and the partition.
type relation struct {
	kind    Kind
	nameCol int
	partCol int // -1 for queues
}

// decoder turns pgoutput messages into committed transactions' targets. It is owned
// by the tailer's goroutine; relation ids are per replication session, so a new
// decoder is made for each connection.
type decoder struct {
	relations map[uint32]relation
	inTx      bool
	seen      map[Target]struct{}
	targets   []Target
}

func newDecoder() *decoder {
	return &decoder{relations: map[uint32]relation{}, seen: map[Target]struct{}{}}
}

// commit is a decoded transaction end.
type commit struct {
	endLSN  pglogrepl.LSN
	time    time.Time
	targets []Target
}

// decode handles one pgoutput message. It returns a non-nil commit at the end of a
// transaction (with no targets when it inserted into neither table).
func (d *decoder) decode(data []byte) (*commit, error) {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("parse pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		d.relation(m)
	case *pglogrepl.BeginMessage:
		d.inTx = true
		d.targets = d.targets[:0]
		clear(d.seen)
	case *pglogrepl.InsertMessage:
		return nil, d.insert(m)
	case *pglogrepl.CommitMessage:
		d.inTx = false
		c := &commit{endLSN: m.TransactionEndLSN, time: m.CommitTime}
		if len(d.targets) > 0 {
			c.targets = append([]Target(nil), d.targets...)
		}
		return c, nil
	}
	return nil, nil
}

func (d *decoder) relation(m *pglogrepl.RelationMessage) {
	if m.Namespace != "streamd" {
		return
	}
	r := relation{nameCol: -1, partCol: -1}
	switch m.RelationName {
	case "events":
		r.kind = KindStream
	case "queue_messages":
		r.kind = KindQueue
	default:
		return
	}
	for i, c := range m.Columns {
		switch c.Name {
		case "stream_name":
			r.nameCol = i
		case "partition":
			r.partCol = i
		}
	}
	if r.nameCol < 0 || (r.kind == KindStream && r.partCol < 0) {
		// A publication without the columns we need: treat inserts as unknown.
		delete(d.relations, m.RelationID)
		return
	}
	d.relations[m.RelationID] = r
}

func (d *decoder) insert(m *pglogrepl.InsertMessage) error {
	r, ok := d.relations[m.RelationID]
	if !ok {
		return nil // not ours
	}
	cols := m.Tuple.Columns
	if r.nameCol >= len(cols) || cols[r.nameCol].DataType != pglogrepl.TupleDataTypeText {
		return fmt.Errorf("insert into %s: no stream_name column in the tuple", r.kind)
	}
	t := Target{Kind: r.kind, Name: string(cols[r.nameCol].Data)}
	if r.kind == KindStream {
		if r.partCol >= len(cols) || cols[r.partCol].DataType != pglogrepl.TupleDataTypeText {
			return fmt.Errorf("insert into events of %s: no partition column in the tuple", t.Name)
		}
		p, err := strconv.ParseInt(string(cols[r.partCol].Data), 10, 32)
		if err != nil {
			return fmt.Errorf("insert into events of %s: partition: %w", t.Name, err)
		}
		t.Partition = int32(p)
	}
	if _, dup := d.seen[t]; !dup {
		d.seen[t] = struct{}{}
		d.targets = append(d.targets, t)
	}
	return nil
}
