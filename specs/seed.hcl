# The seed pipeline on synthetic nodes: 5 target replicas feed 3 drafter
# replicas that step together (data-parallel training). With round_robin the
# wiring is 2-2-1, drafter 2 starves and holds the other two back at every
# step. One line fixes it:
#
#   dflow run specs/seed.hcl --set edge.hs.policy=shared

pipeline "seed" {
  description = "5 targets on 3 synchronized drafters, synthetic timings"
}

variable "items" {
  default = 300
}

variable "targets" {
  default = 5
}

stage "reader" {
  node = "synthetic_source"
  config {
    count      = var.items
    size_bytes = 1024
    type       = "tokens"
  }
}

stage "target" {
  node     = "synthetic_work"
  replicas = var.targets
  config {
    service_time = "lognormal(50ms, 0.1)"
  }
}

stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = "25ms"
    sync         = true
  }
}

stage "done" {
  node = "sink"
}

edge "tokens" {
  from     = reader.out
  to       = target.in
  policy   = "shared"
  capacity = 16
}

edge "hs" {
  from     = target.out
  to       = drafter.in
  policy   = "round_robin" # 2-2-1: drafter 2 starves; "shared" balances it
  capacity = 8
}

edge "trained" {
  from = drafter.out
  to   = done.in
}
