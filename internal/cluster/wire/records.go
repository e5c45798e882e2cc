package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ChainRecord is a share's record of its chains' figures (KeyChain).
type ChainRecord struct {
	// Committed is what the heads it settled derived, by chained edge,
	// less what Recounted holds.
	Committed map[string]int64 `json:"committed,omitempty"`
	// Recounted is what a resuming source's heads in the job's Recount
	// derived here: a lost share recorded them, and its position may not
	// have moved past them.
	Recounted map[string]int64 `json:"recounted,omitempty"`
	// Redone are the stream heads it settled that the server had
	// delivered before (to a share lost with them, maybe, which recorded
	// them), each with what it derived (chainFigures).
	Redone map[string]map[string]int64 `json:"redone,omitempty"`
	// Last are the heads of the latest settle recorded: recorded before
	// they were acked (or the position moved past them), they come back
	// where the acks did not reach the server.
	Last ChainHeads `json:"last"`
	// Sealed: the coordinator counted the share lost and sealed its
	// record; the share writes no more of it, and acks nothing more.
	Sealed bool `json:"sealed,omitempty"`
}

// MergeSources adds o's sources' ranges.
func (hs *ChainHeads) MergeSources(o ChainHeads) {
	for k, rs := range o.Sources {
		if hs.Sources == nil {
			hs.Sources = map[string][][2]int64{}
		}
		hs.Sources[k] = append(hs.Sources[k], rs...)
	}
}

// IsWrongRevision says err is a key-value update refused for its expected
// revision (the key was written since).
func IsWrongRevision(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// KeyChain is a share's chain record.
func KeyChain(instance string) string { return "chain." + Token(instance) }

// ChainTwice is what stream heads settled by more than one share derived
// on each chained edge, counted once for each share past the first. A
// head is settled twice only where the server delivered it again, its
// first holder's ack lost: the first recorded it in its last settle
// (Last), and every later one saw it delivered before (Redone).
func ChainTwice(recs map[string]ChainRecord) map[string]int64 {
	by := map[string]map[string]bool{} // head -> the shares that settled it
	note := func(id, share string) {
		if by[id] == nil {
			by[id] = map[string]bool{}
		}
		by[id][share] = true
	}
	for share, rec := range recs {
		for _, id := range rec.Last.IDs {
			note(id, share)
		}
		for id := range rec.Redone {
			note(id, share)
		}
	}
	out := map[string]int64{}
	for id, shares := range by {
		if len(shares) < 2 {
			continue
		}
		for share := range shares {
			if counts, ok := recs[share].Redone[id]; ok {
				for e, n := range counts {
					out[e] += n * int64(len(shares)-1)
				}
				break
			}
		}
	}
	return out
}

// ChainHeads names heads: a stream's items by id, a resuming source's by
// the ranges of its items (k from [0] up to [1]) that a position move
// passed, by the source's position key.
type ChainHeads struct {
	IDs     []string              `json:"ids,omitempty"`
	Sources map[string][][2]int64 `json:"sources,omitempty"`
}

// SavesNote is what a share says of a local group's saves.
type SavesNote struct {
	Share string `json:"share"`
	Stage string `json:"stage"`
	Saves bool   `json:"saves,omitempty"`
	Final bool   `json:"final,omitempty"`
	// Step is the last save's (-1: none yet); Skip[replica] the ids of
	// the items trained up to it that may not be settled
	Step int        `json:"step"`
	Skip [][]string `json:"skip,omitempty"`
}

// Restore is the coordinator's order to the restart of a group lost whole
// that summed on one worker: restore the save of Step, dropping the items
// of Skip[replica] if they come back; Final: the group had written its
// final save, so its restarts restore nothing, drop every item, and save
// nothing.
type Restore struct {
	Step  int        `json:"step"`
	Skip  [][]string `json:"skip,omitempty"`
	Final bool       `json:"final,omitempty"`
}

func SubjSaves(run, stage string) string { return "dflow.r." + run + ".saves." + Token(stage) }

// ReadChain reads share inst's chain record from the run's end bucket
// (none: the share recorded nothing).
func ReadChain(ctx context.Context, ends jetstream.KeyValue, inst string) (ChainRecord, error) {
	var rec ChainRecord
	e, err := ends.Get(ctx, KeyChain(inst))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, nil
	}
	if err != nil {
		return rec, err
	}
	return rec, json.Unmarshal(e.Value(), &rec)
}

// SealChain seals share inst's chain record (ChainRecord.Sealed), made
// sealed if it wrote none, and returns it as sealed. Every write of a
// share expects the revision of its last (compare and set), so once the
// seal is stored the share writes no more of it: a share counted lost
// that was only slow fails its next record, and so acks nothing more.
func SealChain(ctx context.Context, ends jetstream.KeyValue, inst string) (ChainRecord, error) {
	key := KeyChain(inst)
	for {
		var rec ChainRecord
		e, err := ends.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			rec.Sealed = true
			b, _ := json.Marshal(&rec)
			if _, err = ends.Create(ctx, key, b); errors.Is(err, jetstream.ErrKeyExists) {
				continue // it wrote one meanwhile
			}
		case err == nil:
			if err = json.Unmarshal(e.Value(), &rec); err != nil {
				return rec, fmt.Errorf("the chains' record of the share %s: %w", inst, err)
			}
			rec.Sealed = true
			b, _ := json.Marshal(&rec)
			if _, err = ends.Update(ctx, key, b, e.Revision()); IsWrongRevision(err) {
				continue // it wrote meanwhile
			}
		}
		if err != nil {
			return rec, fmt.Errorf("sealing the chains' record of the share %s: %w", inst, err)
		}
		return rec, nil
	}
}
