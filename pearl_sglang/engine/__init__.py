"""What runs beside real SGLang: launch arguments per role."""
