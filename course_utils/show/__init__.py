"""What a lesson shows: plots, result rows, the leaderboard across machines."""
