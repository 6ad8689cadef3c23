"""The trainers: the RL loop (`trainers.rl.Trainer`), the supervised warm start
(`trainers.sft.SftTrainer`), the memory plan of their steps (`trainers.plan`) and what it asks of
a device (`trainers.memory`). They sit above everything they run (envs, models, the RL core, run
folders, SFT data) and below the CLI."""
