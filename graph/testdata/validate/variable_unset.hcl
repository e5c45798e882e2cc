variable "count" {
  type = number
}

variable "bad_default" {
  type    = number
  default = "many"
}

stage "source" {
  node = "synthetic_source"
  config {
    count = var.count
  }
}

stage "sink" {
  node = "sink"
}

edge "e" {
  from = source.out
  to   = sink.in
}
