# The main job, specs/dflash.hcl, with its targets in PyTorch: the same
# spec but for the plugin block, the target stage's node and threads, the
# number of batches and the drafter's file, its own, so that the main
# job's is not replaced. From the clone:
#   dflow run plugins/examples/torch/dflash.hcl

plugin "torch" {
  path = "dflow-plugin-torch" # beside this file
}

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
  default = 240 # a tenth of the main job's (--var batches=2400 for all of it)
}

variable "checkpoint" {
  default = "drafter-torch.safetensors"
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
  node     = "torch/target_forward" # was "target_forward"
  replicas = var.targets
  devices  = ["cpu"]
  config {
    model   = "models/target.safetensors"
    threads = 1 # a torch thread per replica: five on a few cores
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
