"""accelerate configs shipped with the package, so `trl-mintrl train ... --accelerate_config NAME` resolves NAME from
any folder. `recipes/accelerate` in the repository is a link to this folder."""
