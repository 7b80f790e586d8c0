package kafka

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// The codecs of a record batch's attributes (the low three bits).
const (
	codecNone   = 0
	codecGzip   = 1
	codecSnappy = 2
	codecLZ4    = 3
	codecZstd   = 4
)

// errCorrupt: a batch whose bytes do not decode (CORRUPT_MESSAGE).
var errCorrupt = errors.New("corrupt record batch")

var zstdDecoders = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		panic(err) // only for bad options
	}
	return d
}}

// xerialHeader starts snappy data framed the way the Java client writes it.
var xerialHeader = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// decompress returns the records of a batch compressed with codec, refusing output
// larger than limit (a decompression bomb costs its request, not the server).
func decompress(codec int16, src []byte, limit int) ([]byte, error) {
	var r io.Reader
	switch codec {
	case codecNone:
		return src, nil
	case codecGzip:
		zr, err := gzip.NewReader(bytes.NewReader(src))
		if err != nil {
			return nil, fmt.Errorf("%w: gzip: %v", errCorrupt, err)
		}
		r = zr
	case codecSnappy:
		return unsnappy(src, limit)
	case codecLZ4:
		r = lz4.NewReader(bytes.NewReader(src))
	case codecZstd:
		d := zstdDecoders.Get().(*zstd.Decoder)
		defer zstdDecoders.Put(d)
		if err := d.Reset(bytes.NewReader(src)); err != nil {
			return nil, fmt.Errorf("%w: zstd: %v", errCorrupt, err)
		}
		r = d
	default:
		return nil, fmt.Errorf("%w: unknown compression codec %d", errCorrupt, codec)
	}
	out, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errCorrupt, codecName(codec), err)
	}
	if len(out) > limit {
		return nil, fmt.Errorf("%w: decompresses to more than %d bytes", errCorrupt, limit)
	}
	return out, nil
}

// unsnappy decodes raw snappy, or the xerial framing (header, then chunks of a 4-byte
// length and a snappy block) that the Java client writes.
func unsnappy(src []byte, limit int) ([]byte, error) {
	block := func(b []byte, room int) ([]byte, error) {
		n, err := s2.DecodedLen(b)
		if err != nil {
			return nil, fmt.Errorf("%w: snappy: %v", errCorrupt, err)
		}
		if n > room {
			return nil, fmt.Errorf("%w: decompresses to more than %d bytes", errCorrupt, limit)
		}
		out, err := s2.Decode(nil, b)
		if err != nil {
			return nil, fmt.Errorf("%w: snappy: %v", errCorrupt, err)
		}
		return out, nil
	}
	if !bytes.HasPrefix(src, xerialHeader) {
		return block(src, limit)
	}
	src = src[len(xerialHeader):]
	if len(src) < 8 {
		return nil, fmt.Errorf("%w: snappy: short xerial header", errCorrupt)
	}
	src = src[8:] // version, compatible version
	var out []byte
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, fmt.Errorf("%w: snappy: short xerial chunk", errCorrupt)
		}
		n := int(binary.BigEndian.Uint32(src))
		src = src[4:]
		if n < 0 || n > len(src) {
			return nil, fmt.Errorf("%w: snappy: xerial chunk of %d bytes, %d left", errCorrupt, n, len(src))
		}
		b, err := block(src[:n], limit-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		src = src[n:]
	}
	return out, nil
}

func codecName(codec int16) string {
	switch codec {
	case codecNone:
		return "none"
	case codecGzip:
		return "gzip"
	case codecSnappy:
		return "snappy"
	case codecLZ4:
		return "lz4"
	case codecZstd:
		return "zstd"
	}
	return fmt.Sprintf("codec %d", codec)
}
