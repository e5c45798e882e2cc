# Pretrains the byte-level target LM with dflow itself: text_reader feeds
# token batches to lm_train, which writes a safetensors model and reports
# held-out bits per byte against an order-3 byte n-gram.
#
#   dflow run specs/pretrain.hcl --var steps=600 --var out=my-target.safetensors
#
# It writes target.safetensors in the current folder by default, never the
# shipped models/target.safetensors unless told to, and refuses to replace
# a model another run wrote: --var overwrite=true replaces it.
#
# The corpus defaults to the Go source tree, which every machine that can
# build dflow has. Reader and trainer must agree on the corpus, holdout and
# seed so that the held-out text stays out of training.

pipeline "pretrain" {
  description = "train the target LM on text"
}

variable "corpus" {
  default = "$GOROOT/src"
}

variable "steps" {
  default = 600
}

variable "out" {
  default = "target.safetensors"
}

variable "overwrite" {
  default = false # replace out when another run wrote it
}

variable "seq_len" {
  default = 128
}

variable "seed" {
  default = 1
}

stage "reader" {
  node = "text_reader"
  config {
    path       = var.corpus
    seq_len    = var.seq_len
    batch_size = 8
    epochs     = 1000
    limit      = var.steps
    seed       = var.seed
  }
}

stage "train" {
  node = "lm_train"
  config {
    path             = var.corpus
    seed             = var.seed
    out              = var.out
    overwrite        = var.overwrite
    steps            = var.steps
    max_seq          = var.seq_len
    checkpoint_every = 100
  }
}

edge "tokens" {
  from     = reader.out
  to       = train.in
  capacity = 4
}
