itemz = 2
