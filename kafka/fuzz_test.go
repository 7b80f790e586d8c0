package kafka

import (
	"bytes"
	"compress/gzip"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// seedFrames are request frames (without their size) that the fuzzers start from.
func seedFrames() [][]byte {
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("fuzz"))
	var out [][]byte
	add := func(req kmsg.Request, v int16) {
		req.SetVersion(v)
		out = append(out, f.AppendRequest(nil, req, 1)[4:])
	}
	add(kmsg.NewPtrApiVersionsRequest(), 3)
	add(kmsg.NewPtrApiVersionsRequest(), 0)
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("t")
	meta.Topics = append(meta.Topics, mt)
	add(meta, 12)
	add(meta, 1)
	prod := kmsg.NewPtrProduceRequest()
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = "t"
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = rawBatch(kmsg.Record{Key: []byte("k"), Value: []byte("v"), Headers: []kmsg.Header{{Key: "h", Value: []byte{0}}}})
	pt.Partitions = append(pt.Partitions, pp)
	prod.Topics = append(prod.Topics, pt)
	add(prod, 9)
	add(prod, 3)
	add(fetchReq("t", 0, 0, 0, 1), 12)
	return out
}

// FuzzDecodeRequest: no frame makes the request decoder panic or hang; what it
// accepts has a handler in range.
func FuzzDecodeRequest(f *testing.F) {
	for _, b := range seedFrames() {
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff, 0xff})
	table := handlerTable(true)
	f.Fuzz(func(t *testing.T, body []byte) {
		h, hd, kreq, err := decodeRequest(table, body)
		if err == nil && kreq != nil && (hd == nil || h.version < hd.min || h.version > hd.max) {
			t.Fatalf("decoded %v v%d outside its handler's range", h.key, h.version)
		}
	})
}

// FuzzDecodeBatch: no produce payload makes the batch decoder panic; a batch it
// accepts has the records its header counts.
func FuzzDecodeBatch(f *testing.F) {
	good := rawBatch(kmsg.Record{Key: []byte("k"), Value: []byte("v")}, kmsg.Record{Value: nil, Headers: []kmsg.Header{{Key: "a"}}})
	f.Add(good)
	f.Add(good[:len(good)-3])
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write(good[61:])
	_ = w.Close()
	f.Add(append(append([]byte{}, good[:61]...), gz.Bytes()...))
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, recs, err := decodeBatch(raw, 1<<20)
		if err == nil && int(b.NumRecords) != len(recs) {
			t.Fatalf("%d records for a count of %d", len(recs), b.NumRecords)
		}
	})
}
