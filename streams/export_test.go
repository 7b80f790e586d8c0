package streams

// CopyAppends returns how many batches were appended with COPY so far. Tests only.
func CopyAppends() int64 { return copyAppends.Load() }
