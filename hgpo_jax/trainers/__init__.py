"""The trainers: the RL loop (`trainers.rl.Trainer`), the supervised warm start
(`trainers.sft.SftTrainer`) and the memory plan of their steps (`trainers.plan`). They sit above
everything they run (envs, models, the RL core, run folders, SFT data) and below the CLI."""
