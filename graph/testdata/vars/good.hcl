targets = 2
items = 50
