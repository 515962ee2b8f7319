"""Task models (encoder + head + loss) and, per task, how its batches are evaluated (row 2)."""
