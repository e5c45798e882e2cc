# The DFlash job: 5 target replicas run the frozen byte-level target LM and
# push hidden states to 3 drafter replicas that train one block drafter
# data-parallel. round_robin wires 5 on 3 as 2-2-1; the fix, writing its own
# drafter beside the one a first run trained (which is not replaced unasked):
#   dflow run specs/dflash.hcl --set edge.hs.policy=shared --var checkpoint=drafter-shared.safetensors

pipeline "dflash" {
  description = "5 target replicas feed 3 drafter replicas"
}

variable "targets" {
  default = 5
}

variable "corpus" {
  default = "$GOROOT/src" # a file, folder or glob of text
}

variable "batches" {
  default = 2400
}

variable "checkpoint" {
  default = "drafter.safetensors"
}

stage "reader" {
  node = "text_reader"
  config {
    path       = var.corpus
    seq_len    = 64
    batch_size = 8
    limit      = var.batches
    max_bytes  = 16777216
  }
}

stage "target" {
  node     = "target_forward"
  replicas = var.targets
  devices  = ["cpu"]
  config {
    model = "models/target.safetensors"
  }
}

stage "drafter" {
  node     = "drafter_train"
  replicas = 3
  config {
    target     = "models/target.safetensors"
    block_size = 4
    checkpoint = var.checkpoint
    eval       = var.corpus
    eval_every = 100 # acceptance length every 100 steps, so the status line shows the latest
    max_bytes  = 16777216
  }
}

edge "tokens" {
  from     = reader.out
  to       = target.in
  policy   = "shared"
  capacity = 16
}

edge "hs" {
  from     = target.hidden
  to       = drafter.hidden
  policy   = "round_robin" # the 2-2-1 split; "shared" balances it
  capacity = 8
}
