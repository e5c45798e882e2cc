stage "source" {
  node = "synthetic_source"
  config {
    count = 1
  }
}

stage "a" {
  node = "synthetic_work"
}

stage "b" {
  node = "synthetic_work"
}

stage "c" {
  node = "synthetic_work"
}

edge "in" {
  from = source.out
  to   = a.in
}

edge "ab" {
  from = a.out
  to   = b.in
}

edge "bc" {
  from = b.out
  to   = c.in
}

edge "ca" {
  from = c.out
  to   = a.in
}
