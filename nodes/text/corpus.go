package text

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/dflow-dev/dflow/nodes"
)

// CheckPath reports a corpus path that names no file or folder, for a
// node kind's Check: a missing corpus fails at validate, as a missing
// model does, rather than when the stage starts. It reads nothing.
func CheckPath(path string) error {
	expanded := nodes.ExpandPath(path)
	matches, err := filepath.Glob(expanded)
	switch {
	case err != nil:
		return fmt.Errorf("bad glob %q: %w", path, err)
	case len(matches) > 0:
		return nil
	case expanded != path:
		return fmt.Errorf("%q (%s) matches no file or folder", path, expanded)
	}
	return fmt.Errorf("%q matches no file or folder", path)
}

// corpusKey identifies a read corpus in the cache.
type corpusKey struct {
	path string
	max  int64
}

var (
	cacheMu sync.Mutex
	cache   = map[corpusKey][]byte{}
)

// ReadCorpus reads a file, a folder (recursively, in name order) or a glob
// of either, up to maxBytes in all. Hidden folders (.git) and files that
// look binary (a NUL byte in their first 8 KiB) are skipped. The result is
// cached per process: stages that read the same corpus share it
// (read-only).
func ReadCorpus(path string, maxBytes int64) ([]byte, error) {
	key := corpusKey{path, maxBytes}
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if b, ok := cache[key]; ok {
		return b, nil
	}
	expanded := nodes.ExpandPath(path)
	matches, err := filepath.Glob(expanded)
	if err != nil {
		return nil, fmt.Errorf("text: bad glob %q: %w", path, err)
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("text: %q (%s) matches no file", path, expanded)
	}
	sort.Strings(matches)
	var buf bytes.Buffer
	for _, m := range matches {
		if err := readInto(&buf, m, maxBytes); err != nil {
			return nil, err
		}
	}
	if buf.Len() == 0 {
		return nil, fmt.Errorf("text: %q holds no text", path)
	}
	cache[key] = buf.Bytes()
	return buf.Bytes(), nil
}

func readInto(buf *bytes.Buffer, root string, maxBytes int64) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("text: %w", err)
		}
		if int64(buf.Len()) >= maxBytes {
			return filepath.SkipAll
		}
		if d.IsDir() {
			if p != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("text: %w", err)
		}
		if bytes.IndexByte(b[:min(len(b), 8192)], 0) >= 0 {
			return nil // binary
		}
		if room := maxBytes - int64(buf.Len()); int64(len(b)) > room {
			b = b[:room]
		}
		buf.Write(b)
		return nil
	})
}

// ChunkSize is the unit of the held-out split.
const ChunkSize = 4096

// Split divides a corpus into training and held-out text: each 4 KiB
// chunk is held out with probability holdout, decided by a hash of the
// seed and the chunk's index, so the split is the same for every stage
// that asks with the same seed.
func Split(data []byte, holdout float64, seed uint64) (train, held []byte) {
	for i := 0; i*ChunkSize < len(data); i++ {
		chunk := data[i*ChunkSize : min((i+1)*ChunkSize, len(data))]
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%d", seed, i)
		if float64(h.Sum64()%1_000_000)/1e6 < holdout {
			held = append(held, chunk...)
		} else {
			train = append(train, chunk...)
		}
	}
	return train, held
}
