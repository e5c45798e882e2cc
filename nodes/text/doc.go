// Package text provides text_reader, the node that turns files of text
// into batches of byte tokens, and the corpus helpers other nodes share
// (reading a file, folder or glob; the held-out split; n-gram baselines).
//
// Invariants: the split of a corpus into training and held-out text
// depends only on the text and the seed, so a reader and an evaluating
// node given the same corpus and seed agree on what was held out; a
// held-out chunk never reaches training.
package text
