pipeline "a" {}
pipeline "b" {}

stage "source" {
  node = "synthetic_source"
  config {
    count = 4
  }
}

stage "source" {
  node = "sink"
}

stage "sink" {
  node = "sink"
}

edge "e" {
  from = source.out
  to   = sink.in
}

edge "e" {
  from = source.out
  to   = sink.in
}

variable "v" {
  default = 1
}

variable "v" {
  default = 2
}
